"""Shared test fixtures: generated test checkpoints (made once per session) and fixture paths.

The suite tests k3's built-ins as documented, so it loads no third-party entry-point plugin (the
examples `make test` installs included): K3_PLUGINS=none for this process and every `k3` it starts.
tests/plugins/test_examples.py runs the installed examples explicitly. Nothing is written into the user's
configuration nor cache: K3_CONFIG_DIR (profile, chat history) and K3_CACHE_DIR (the prompt cache's files) are
fresh directories per run, removed at its end.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

os.environ["K3_PLUGINS"] = "none"
os.environ["K3_CONFIG_DIR"] = tempfile.mkdtemp(prefix="k3-test-config-")
os.environ["K3_CACHE_DIR"] = tempfile.mkdtemp(prefix="k3-test-cache-")
for _made in ("K3_CONFIG_DIR", "K3_CACHE_DIR"):
    atexit.register(shutil.rmtree, os.environ[_made], True)  # one per run, gone when the run ends

import pytest

from k3core.testmodel.make import make_model

FIXTURES = Path(__file__).parent / "fixtures"
DEMO_MODEL = Path(__file__).resolve().parents[1] / "wizard" / "data" / "demo-model"  # the trained, shipped one
K3_IN_C = FIXTURES / "k3-in-c"
ORACLES = FIXTURES / "oracles"


@pytest.fixture(scope="session")
def model_factory(tmp_path_factory):
    """make(shape, seed=0, layout="nested") -> directory, each generated once per session."""
    made = {}

    def make(shape="tiny", seed=0, layout="nested"):
        key = (shape, seed, layout)
        if key not in made:
            made[key] = make_model(tmp_path_factory.mktemp(f"{shape}-{seed}-{layout}") / "model", shape, seed, layout)
        return made[key]

    return make


@pytest.fixture(scope="session")
def tiny_model(model_factory):
    return model_factory("tiny")


@pytest.fixture(scope="session")
def small_model(model_factory):
    return model_factory("small")
