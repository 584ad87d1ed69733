"""Fixtures for the wizard tests: an isolated environment (profile dir, HF home, no offline mode, no token),
the demo-shape checkpoint's bytes, a mock Hub serving them as `test/k3-small`, and a `k3` runner."""
from __future__ import annotations

import json
from pathlib import Path

import huggingface_hub.constants as hf_constants
import pytest

from k3core.cli.main import main

from .hubserver import MockHub

REPO = "test/k3-small"
VISION_SHARD = "model-00012-of-000012.safetensors"   # the small test model's vision shard


@pytest.fixture(autouse=True)
def wizard_env(tmp_path, monkeypatch):
    monkeypatch.setenv("K3_CONFIG_DIR", str(tmp_path / "k3-config"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    for var in ("HF_HUB_DISABLE_TELEMETRY", "HF_HUB_DISABLE_XET", "HF_HUB_DISABLE_UPDATE_CHECK"):
        monkeypatch.setenv(var, "1")
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    # huggingface_hub reads these at import time: point them at this test's (empty) HF home too
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    monkeypatch.setattr(hf_constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "hf-home" / "stored_tokens"))


@pytest.fixture(scope="session")
def small_files(small_model) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(small_model).iterdir())  # what a Hub repository holds:
            if p.is_file() and p.name != "k3-tensor-sums.bin"}                  # not k3's own record


@pytest.fixture
def hub(small_files, monkeypatch):
    server = MockHub()
    server.sha = server.add_repo(REPO, small_files)
    monkeypatch.setenv("HF_ENDPOINT", server.start())
    yield server
    server.stop()


@pytest.fixture
def k3(capsys):
    """k3(*argv) -> (exit code, stdout, stderr), in process, as the `k3` command."""
    def run(*argv):
        rc = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return rc, out, err
    return run


def setup_args(dest, source=f"hf://{REPO}", *extra):
    return ["setup", "--source", source, "--dest", dest, "--yes", "--read-mb", "1", "--jobs", "3", "--no-tune", *extra]


def state_of(dest) -> dict:
    return json.loads((Path(dest) / ".k3-setup.json").read_text())
