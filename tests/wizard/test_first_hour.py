"""Issue 28, getting started: setup's last step prints the commands the way this shell runs them; the codec
line says whose projection it prints and that a model in RAM streams nothing; `make demo` ends quietly on Ctrl-C.
Issue 42: while pip compiles the C++ kernels (`make demo` and `make test`), a line every 15 s says it still is, and a
failed build still shows pip's error and stops make."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from k3core.plan.profile import load_profile
from wizard import steps

ROOT = Path(__file__).resolve().parents[2]


def test_the_next_command_is_k3_when_the_path_finds_this_install(monkeypatch):
    mine = Path(sys.executable).parent / "k3"
    monkeypatch.setattr(steps.shutil, "which", lambda name: str(mine))
    assert steps.k3_command() == ("k3", None)


def test_the_next_command_is_this_install_s_path_when_k3_is_not_on_the_path(monkeypatch, tmp_path):
    monkeypatch.setattr(steps.shutil, "which", lambda name: None)
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "activate").write_text("")
    monkeypatch.setattr(steps.sys, "executable", str(venv / "python"))
    monkeypatch.chdir(tmp_path)
    assert steps.k3_command() == (".venv/bin/k3", ".venv/bin/activate")
    monkeypatch.chdir(ROOT)  # elsewhere: the whole path
    assert steps.k3_command() == (str(venv / "k3"), str(venv / "activate"))


def test_setup_prints_runnable_commands_and_labels_the_projection(k3, tmp_path, monkeypatch):
    monkeypatch.setattr(steps.shutil, "which", lambda name: None)
    rc, out, err = k3("setup", "--source", "demo", "--dest", tmp_path / "demo", "--yes", "--read-mb", "1",
                      "--tune-minutes", "0.05")
    assert rc == 0, err
    assert "[7/8] tune: k3 tune: short exact trials" in out and "      [1] untuned: " in out  # its lines, as they come
    assert re.search(r"-> .*; saved in the profile  \[", out)
    assert load_profile().tuned["model"] == str(tmp_path / "demo")
    shown = steps.k3_command()[0]  # .venv/bin/k3 from the repository's root
    assert shown != "k3" and re.search(rf"^      {re.escape(shown)} chat +# talk to it", out, re.M), out
    assert "`k3` alone is not on this shell's PATH: `source " in out
    codec = next(line for line in out.splitlines() if line.strip().startswith("codec "))
    assert "streaming the released Kimi K3's whole trunk projects" in codec
    assert re.search(r"this model \(\d[\d.]* [kM]B\) fits in RAM, so nothing of it streams", codec), codec


def test_make_demo_ends_quietly_on_ctrl_c(tmp_path):
    """The demo's last recipe line, as the Makefile has it, with a stand-in `k3` that exits 130 on Ctrl-C as k3 ui
    does: make prints no error line."""
    recipe = [line for line in (ROOT / "Makefile").read_text().splitlines()
              if line.startswith("\t") and "bin/k3 ui" in line and "echo" not in line]
    assert len(recipe) == 1, recipe
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "k3").write_text(f"#!{sys.executable}\nimport sys, time\n"  # Ctrl-C may come as 'serving' is out
                                "try:\n    print('serving', flush=True)\n    time.sleep(60)\n"
                                "except KeyboardInterrupt:\n    print('stopped', flush=True)\n    sys.exit(130)\n")
    (bin_dir / "k3").chmod(0o755)
    (tmp_path / "Makefile").write_text(f"VENV := {tmp_path / 'venv'}\ndemo:\n{recipe[0]}\n")

    def session():
        os.setsid()
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    make = subprocess.Popen(["make", "-s", "demo"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, preexec_fn=session)
    deadline = time.monotonic() + 20
    while "serving" not in (make.stdout.readline() or "") and time.monotonic() < deadline:
        pass
    os.killpg(make.pid, signal.SIGINT)  # Ctrl-C reaches the terminal's whole foreground group
    rest, _ = make.communicate(timeout=20)
    assert "stopped" in rest and "make:" not in rest, rest


def ticker(*command, every="1"):
    return subprocess.run(["sh", str(ROOT / "scripts" / "ticker.sh"), every, "compiling", *command],
                          capture_output=True, text=True, timeout=60)


def test_a_slow_build_says_every_few_seconds_that_it_is_still_working():
    done = ticker("sh", "-c", "sleep 2.5; echo built")
    assert done.returncode == 0 and done.stderr == ""
    assert re.fullmatch(r"(k3: compiling: \d s so far\n){2,3}built\nk3: compiling: done in \d s\n", done.stdout), \
        done.stdout


def test_a_failed_build_shows_pips_error_and_stops_make(tmp_path):
    """The install recipe line, as the Makefile has it (`make test` and `make demo` both depend on it), with a
    stand-in pip that fails at once: its error shown, the failure said, make stopped."""
    recipe = [line for line in (ROOT / "Makefile").read_text().splitlines()
              if line.startswith("\t") and "ticker.sh" in line]
    assert recipe == ["\tsh scripts/ticker.sh 15 \"installing and compiling\" $(PY) -m pip install --quiet -e "
                      "'.[test]'"]
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "ticker.sh").write_bytes((ROOT / "scripts" / "ticker.sh").read_bytes())
    pip = tmp_path / "python"
    pip.write_text("#!/bin/sh\necho 'error: subprocess-exited-with-error: g++: internal compiler error' >&2\n"
                   "exit 1\n")
    pip.chmod(0o755)
    (tmp_path / "Makefile").write_text(f"PY := {pip}\ninstall:\n{recipe[0]}\n\ttouch installed\n")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}  # not a sub-make
    make = subprocess.run(["make", "-s", "install"], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env)
    assert make.returncode == 2 and not (tmp_path / "installed").exists()
    assert re.match(r"error: subprocess-exited-with-error: g\+\+: internal compiler error\nk3: installing and "
                    r"compiling: FAILED after \d+ s \(exit 1\): the output above says why\n", make.stderr), make.stderr
    assert "make: *** [Makefile:3: install] Error 1" in make.stderr
