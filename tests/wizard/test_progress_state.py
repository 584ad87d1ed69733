"""The progress meter (terminal: a tqdm bar; plain: one line per file) and the state file's lock and
atomic writes."""
from __future__ import annotations

import io

import pytest

from k3core.report.meters import ProgressMeter as Meter
from wizard.progress import estimate, human, pack_estimate, span
from wizard.state import SetupState, StateError


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_gets_a_bar_and_a_line_per_finished_file():
    out = Tty()
    m = Meter("downloaded", 3000, 2, stream=out)
    m.start("a.safetensors", 1000)
    m.start("b.safetensors", 2000)
    m.advance("a.safetensors", 1000)
    m.finish("a.safetensors")
    m.message("b.safetensors: stalled; reconnecting")
    m.advance("b.safetensors", 500)
    m.close()
    text = out.getvalue()
    assert "\r" in text and "%|" in text and "/3.00k" in text  # the bar, redrawn in place
    assert "downloaded 1/2 (b.safetensors)" in text  # what is under way
    assert "  downloaded a.safetensors (1 kB" in text and "[1/2]" in text
    assert "  b.safetensors: stalled; reconnecting\n" in text


def test_plain_stream_prints_one_line_per_file():
    out = io.StringIO()
    m = Meter("downloaded", 3000, 2, stream=out, every=3600)
    for name, size in (("a", 1000), ("b", 2000)):
        m.start(name, size)
        m.advance(name, size)
        m.finish(name)
    m.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "\x1b" not in out.getvalue()
    assert lines[0].startswith("  downloaded a (1 kB") and lines[0].endswith("[1/2]") and lines[1].endswith("[2/2]")


def test_sizes_and_estimates_read_well():
    assert human(1_560_936_091_448) == "1.56 TB" and human(113.5e9) == "114 GB"
    assert estimate(3e9, 1e8) == "about 30 s" and estimate(1.56e12, 1e8) == "about 4 h 20 min"
    assert estimate(1, None).startswith("time unknown")


def test_a_pack_is_estimated_as_a_range_that_holds_on_a_slow_busy_two_core_machine():
    demo, k3 = 2.44e6, 113.5e9
    assert pack_estimate(demo, 1.5e9, "auto") == "2-15 s"  # the codec choice's timing; it took 5.4 s, said "about 1 s"
    assert pack_estimate(k3, 1e9, "auto") == "4-48 min" and pack_estimate(k3, 1e9, "planes") == "4-47 min"
    assert pack_estimate(k3, 3e9, "raw") == "76 s to 3 min" and pack_estimate(demo, 1.5e9, "raw") == "about 1 s"
    assert span(30, 30.4) == "about 30 s" and span(3600, 9000) == "60 min to 2 h 30 min"


def test_one_wizard_per_destination(tmp_path):
    first = SetupState.open(tmp_path, {"source": "demo"})
    try:
        with pytest.raises(StateError, match="another `k3 setup` is working"):
            SetupState.open(tmp_path, {"source": "demo"})
    finally:
        first.close()
    again = SetupState.open(tmp_path, {"source": "demo"})
    again.finish("check", "ok")
    again.close()
    assert SetupState.open(tmp_path, {"source": "demo"}).step("check") is not None


def test_demo_refuses_a_directory_with_other_files(k3, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.txt").write_text("precious")
    rc, _, err = k3("setup", "--source", "demo", "--dest", tmp_path / "mine", "--yes", "--read-mb", "1",
                      "--no-tune")
    assert rc == 2 and "not a k3 demo or test model" in err
    assert (tmp_path / "mine" / "thesis.txt").read_text() == "precious"
