"""The downloader against the mock Hub: a cut connection resumes at the byte (the server counts what it
serves), a server that ignores Range restarts the file and says so, a stalled transfer is reconnected, and
a `k3 setup` killed with SIGKILL mid-shard resumes without fetching the finished bytes again."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from wizard.steps import Setup

from .conftest import REPO, setup_args, state_of
from .test_steps import interrupt

SHARD = "model-00004-of-000012.safetensors"   # 293,144 bytes


def shard_requests(hub, name=SHARD):
    return [r for r in hub.requests if r[0] == "GET" and r[1].endswith(f"/resolve/{hub.sha}/{name}")]


def header_bytes(data: bytes) -> int:
    return 8 + int.from_bytes(data[:8], "little")


def test_cut_connection_resumes_at_the_byte(hub, k3, tmp_path, small_files):
    hub.cut[SHARD] = 100_000
    dest = tmp_path / "model"
    rc, out, err = k3(*setup_args(dest, f"hf://{REPO}", "--no-pack"))
    assert rc == 0, err
    assert (dest / SHARD).read_bytes() == small_files[SHARD]
    ranges = [r[2] for r in shard_requests(hub)]
    assert ranges[-2:] == [None, "bytes=100000-"]                       # the whole file, then the rest
    assert hub.served[SHARD] == header_bytes(small_files[SHARD]) + len(small_files[SHARD])   # nothing twice
    assert "reconnecting" in err and "connection" in (dest / ".k3-setup.log").read_text()


def test_server_ignoring_range_restarts_the_file(hub, k3, tmp_path, small_files, monkeypatch):
    dest = tmp_path / "model"
    with monkeypatch.context() as m:          # steps 1-2 first: the trunk estimate's header reads use Range too
        m.setattr(Setup, "step_download", interrupt)
        assert k3(*setup_args(dest, f"hf://{REPO}", "--no-pack"))[0] == 130
    hub.cut[SHARD] = 100_000
    hub.ignore_range = True
    rc, out, err = k3(*setup_args(dest, f"hf://{REPO}", "--no-pack"))
    assert rc == 0, err
    assert "ignored the Range request" in err and "from byte 0" in err
    assert (dest / SHARD).read_bytes() == small_files[SHARD]


def test_stall_watchdog_reconnects(hub, k3, tmp_path, small_files):
    hub.stall[SHARD] = (50_000, 3.0)
    dest = tmp_path / "model"
    t0 = time.monotonic()
    rc, out, err = k3(*setup_args(dest, f"hf://{REPO}", "--no-pack", "--stall", "0.5"))
    assert rc == 0, err
    assert "stalled: no bytes for 0.5 s" in err and time.monotonic() - t0 < 20
    assert [r[2] for r in shard_requests(hub)][-1] == "bytes=50000-"
    assert (dest / SHARD).read_bytes() == small_files[SHARD]


def test_hash_mismatch_is_fetched_again_then_refused(hub, k3, tmp_path, small_files):
    bad = bytearray(small_files[SHARD])
    bad[-1] ^= 1
    hub.repos[REPO]["commits"][hub.sha][SHARD] = bytes(bad)    # the Hub lists one sha256 and serves other bytes
    hub.listing_sizes = {}
    import hashlib
    real_entry = hub.entry
    hub.entry = lambda p, d: real_entry(p, small_files[SHARD] if p == SHARD else d)
    rc, out, err = k3(*setup_args(tmp_path / "model", f"hf://{REPO}", "--no-pack"))
    assert rc == 1 and SHARD in err and "does not match the Hub's" in err and "(twice)" in err
    assert not (tmp_path / "model" / SHARD).exists()
    assert hashlib.sha256(bad).hexdigest() != hashlib.sha256(small_files[SHARD]).hexdigest()


def test_kill_9_mid_shard_resumes_without_refetching(hub, k3, tmp_path, small_files):
    hub.throttle = 100_000                         # bytes/s per connection: a few s a shard
    dest = tmp_path / "model"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "k3core", *setup_args(dest, f"hf://{REPO}", "--no-pack")],
                            env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "first-run.err", "w"))
    try:
        deadline, partial = time.monotonic() + 30, {}
        while time.monotonic() < deadline and not partial and proc.poll() is None:
            time.sleep(0.05)
            try:
                files = state_of(dest)["files"]
            except (OSError, ValueError, KeyError):
                continue
            partial = {n: r["bytes"] for n, r in files.items() if r["status"] == "partial" and r["bytes"] > 0
                       and n.endswith(".safetensors")}
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert partial, "the download never got going"
    recorded = {n: r["bytes"] for n, r in state_of(dest)["files"].items() if r["status"] == "partial"}
    before = None
    while before != dict(hub.served):             # the server's writes into the dead socket stop
        before = dict(hub.served)
        time.sleep(0.3)
    hub.throttle = None
    rc, out, err = k3(*setup_args(dest, f"hf://{REPO}", "--no-pack"))
    assert rc == 0, err
    assert "[2/8] destination and free space: done earlier" in out
    for name, done in recorded.items():
        if not 0 < done < len(small_files[name]):     # all there but not yet renamed: hashed, not fetched
            assert hub.served[name] == before.get(name, 0)
            continue
        assert f"{name}: resuming at byte {done:,}" in err
        assert shard_requests(hub, name)[-1][2] == f"bytes={done}-"
        # the second run fetched exactly the bytes the first had not recorded as safely on disk
        assert hub.served[name] - before.get(name, 0) == len(small_files[name]) - done
    for name, data in small_files.items():
        if (dest / name).exists() and name != "model.safetensors.index.json":
            assert (dest / name).read_bytes() == data, name
    assert json.loads((dest / ".k3-setup.json").read_text())["steps"]["verify"]
