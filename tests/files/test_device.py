"""The disk counters the run report and `k3 bench stream` show (k3core/files/device.py)."""
from __future__ import annotations

import os

import pytest

from k3core.files import device
from k3core.files.aligned_io import aligned_buffer, open_for_reading, read_into


def test_a_stat_line_is_read_as_bytes_and_busy_milliseconds(tmp_path):
    block = tmp_path / "254:0"
    (tmp_path / "vda").mkdir()
    block.symlink_to(tmp_path / "vda")
    stat = block / "stat"
    stat.write_text("   16709656   178797 32099038186 822730803  1781569  1045784 186113680  1254147        0  9922696 "
                    "824146620  1175287        3 140718960   144171   387425    17497\n")
    snap = device.read_snapshot(stat)
    assert (snap.device, snap.read_bytes, snap.busy_ms) == ("vda", 32099038186 * 512, 9922696)
    stat.write_text("1 2 3\n")
    with pytest.raises(ValueError, match="3 fields"):
        device.read_snapshot(stat)


def test_activity_is_the_difference_of_two_snapshots():
    before = [device.DeviceSnapshot("vda", 10_000, 1_000, 5.0)]
    after = [device.DeviceSnapshot("vda", 10_000 + 3_000_000_000, 2_500, 7.0)]
    (a,) = device.activity(before, after)
    assert a["read_bytes"] == 3_000_000_000 and a["busy_seconds"] == pytest.approx(1.5)
    assert a["busy_share"] == pytest.approx(0.75) and a["rate_while_busy"] == pytest.approx(2e9)
    (idle,) = device.activity(before, before)
    assert idle["rate_while_busy"] is None


def test_a_direct_read_shows_on_the_disk_under_the_file(tmp_path):
    path = tmp_path / "blob"
    path.write_bytes(os.urandom(8 << 20))
    if device.stat_file(path) is None:
        pytest.skip(f"{tmp_path} has no block device under it (tmpfs or overlay)")
    opened = open_for_reading(path)
    if not opened.direct:
        pytest.skip(f"{tmp_path}: {opened.mode}; a buffered read may come from the page cache")
    buf = aligned_buffer(8 << 20)
    before = device.snapshots([path, tmp_path])  # one device, however many paths are on it
    assert len(before) == 1
    assert read_into(opened, memoryview(buf), 0, 8 << 20) == 8 << 20
    (a,) = device.activity(before, device.snapshots([path]))
    os.close(opened.fd)
    assert a["read_bytes"] >= 8 << 20 and a["wall_seconds"] > 0


def test_counters_that_cannot_be_read_are_a_report_line_not_a_failed_run(tiny_model, tmp_path, capsys, monkeypatch):
    import json

    from k3core.cli.main import main

    def unreadable(paths):
        raise OSError("/sys/dev/block/254:0/stat: Permission denied")

    monkeypatch.setattr(device, "snapshots", unreadable)
    report = tmp_path / "r.json"
    assert main(["run", str(tiny_model), "--ids", "1,2,3", "--gen", "3", "--json", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["disk_activity"] == [] and "Permission denied" in data["disk_activity_error"]
    assert "disk counters not read: /sys/dev/block/254:0/stat: Permission denied" in capsys.readouterr().err
