"""The example plugins under examples/ (installed into the venv by `make install`): they pass the
conformance kit through `k3 plugins --check`, installed they become the defaults and say so in one line
per run, and with them the ids and logit bytes are those of the built-ins."""
from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = {"k3-store-2q": ("expert store", "twoq"), "k3-counting-kernels": ("kernel backend", "counting")}


def k3(*argv, plugins=None):
    env = {k: v for k, v in os.environ.items() if k != "K3_PLUGINS"}
    if plugins is not None:
        env["K3_PLUGINS"] = plugins
    return subprocess.run([sys.executable, "-m", "k3core", *map(str, argv)], env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module", autouse=True)
def installed():
    missing = []
    for dist in EXAMPLES:
        try:
            importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            missing.append(dist)
    assert not missing, f"{', '.join(missing)} not installed: `make test` installs examples/ into the venv for its run"


def test_both_examples_pass_the_conformance_kit():
    for dist, (kind, name) in EXAMPLES.items():
        r = k3("plugins", "--check", dist)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"{kind} {name!r} ({dist} 0.1.0)" in r.stdout and "FAIL" not in r.stdout
        assert "0 failed" in r.stdout


def test_each_readme_states_the_number_of_checks_the_kit_runs():
    from k3_counting_kernels import CountingKernels
    from k3_store_2q import TwoQStore
    from k3core.testing import expert_store_checks, kernel_backend_checks

    kit = {"k3-store-2q": len(expert_store_checks(TwoQStore)),
           "k3-counting-kernels": len(kernel_backend_checks(CountingKernels()))}
    for dist, count in kit.items():
        readme = (Path(__file__).parents[2] / "examples" / dist / "README.md").read_text(encoding="utf-8")
        stated = [int(n) for n in re.findall(r"the conformance kit: (\d+) checks", readme)]
        assert stated == [count], f"examples/{dist}/README.md states {stated} conformance checks; the kit runs {count}"


def test_installed_they_are_the_defaults_say_so_and_change_no_bit(tiny_model, tmp_path):
    runs = {}
    for label, plugins in (("examples", None), ("built-ins", "none")):
        logits = tmp_path / f"{label}.f32"
        r = k3("run", tiny_model, "--ids", "3,1,4,1,5,9,2,6", "--gen", "8", "--cache-gb", "0.0002",
               "--dump-logits", logits, plugins=plugins)
        assert r.returncode == 0, r.stderr
        runs[label] = (r.stdout.split(), logits.read_bytes(), r.stderr)
    assert runs["examples"][:2] == runs["built-ins"][:2]
    err = runs["examples"][2]
    assert "kernels counting, trunk placer resident, expert store twoq" in err
    for dist, (kind, name) in EXAMPLES.items():
        assert err.count(f"k3: using {kind} {name!r} from {dist} 0.1.0 (an installed plugin, the default here)") == 1
    assert "k3: using" not in runs["built-ins"][2]
