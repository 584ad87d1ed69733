"""The README's "Embed k3 in your program" example runs as written, against a demo-model directory; its `make demo`
sample shows what the Makefile's `k3 run` line really prints (issue 42)."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def embed_example() -> str:
    text = README.read_text()
    section = text.split("## Embed k3 in your program", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def demo_sample() -> list[str]:
    """The lines of the README's `make demo` sample."""
    return re.search(r"```\n\$ make demo\n(.*?)```", README.read_text(), re.S).group(1).splitlines()


def test_the_make_demo_sample_shows_what_k3_run_prints(capsys):
    from k3core.cli.main import main

    from ..conftest import DEMO_MODEL

    recipe = [line.strip().replace("$(VENV)", ".venv") for line in (README.parent / "Makefile").read_text().splitlines()
              if line.startswith("\t$(VENV)/bin/k3 run ")]
    sample = demo_sample()
    assert len(recipe) == 1 and recipe[0] in sample  # the command as make echoes it
    argv = shlex.split(recipe[0])[1:]
    assert main([argv[0], str(DEMO_MODEL), *argv[1:]]) == 0  # the profile's model: the demo model, as `make demo` has
    out, err = capsys.readouterr()
    printed = (err + out).splitlines()  # what k3 says on stderr comes before the reply starts
    start = sample.index(recipe[0]) + 1
    shown = [line.replace("/home/you/k3/demo-model", str(DEMO_MODEL)) for line in sample[start:start + len(printed)]]
    assert shown == printed


def test_the_embedding_example_is_short_and_runs(small_model, tmp_path):
    code = embed_example()
    assert len(code.strip().splitlines()) <= 10
    shutil.copytree(small_model, tmp_path / "demo-model")
    (tmp_path / "example.py").write_text(code)
    r = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(README.parent)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("memory plan") and re.search(r"\n\d+ tokens, \d+\.\d{3} s/token\n$", r.stdout)


def test_a_misspelled_option_is_an_error_naming_it_and_the_valid_ones(small_model):
    import pytest

    from k3core import EngineConfig, memory_plan
    from k3core.errors import UsageError

    with pytest.raises(UsageError, match=r"the expert store 'lru' has no option 'cach_gb'; its options are: direct_io"):
        memory_plan(EngineConfig(small_model, store_options={"cach_gb": 1}))
    with pytest.raises(UsageError, match=r"bad engine config:\n  - threads must be an integer in 1..1024, got 0\n"
                                         r"  - ring must be an integer >= 2"):
        EngineConfig(small_model, threads=0, ring=1)
