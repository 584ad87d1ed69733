"""The Hub side: the mock speaks the protocol the real huggingface_hub client uses; listings with unsafe names
are refused before anything is written; 401 explains HF_TOKEN, and the token never shows up anywhere."""
from __future__ import annotations

import hashlib

import pytest
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url

from wizard.hub import Hub, HubError, check_remote_name

from .conftest import REPO, setup_args


def test_mock_answers_the_real_client(hub, small_files):
    api = HfApi(endpoint=hub_endpoint())
    assert api.model_info(REPO, revision="main").sha == hub.sha
    listed = {f.path: f for f in api.list_repo_tree(REPO, revision=hub.sha, recursive=True)}
    assert set(listed) == set(small_files)
    shard = "model-00001-of-000012.safetensors"
    assert listed[shard].size == len(small_files[shard])
    assert listed[shard].lfs.sha256 == hashlib.sha256(small_files[shard]).hexdigest()
    meta = get_hf_file_metadata(hf_hub_url(REPO, shard, revision="main", endpoint=hub_endpoint()))
    assert (meta.commit_hash, meta.size, meta.etag) == (hub.sha, len(small_files[shard]),
                                                      hashlib.sha256(small_files[shard]).hexdigest())


def hub_endpoint():
    import os
    return os.environ["HF_ENDPOINT"]


def test_hub_resolves_lists_and_reads_ranges(hub, small_files):
    h = Hub(REPO)
    assert h.resolve("main") == hub.sha
    files = {f.path: f for f in h.listing(hub.sha)}
    assert files["config.json"].sha256 is None and files["config.json"].oid
    assert h.read_range("config.json", hub.sha, 2, 5) == small_files["config.json"][2:7]
    with pytest.raises(HubError, match="no such revision"):
        h.resolve("nope")
    with pytest.raises(HubError, match="not found"):
        Hub("test/absent").resolve("main")


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a\\b", "sub/../../x", "./x", "a//b", ".k3-setup.json",
                                  "bad\nname", ""])
def test_unsafe_names(name):
    with pytest.raises(HubError, match="not a plain relative path"):
        check_remote_name(name, REPO)


@pytest.mark.parametrize("evil", ["../x.safetensors", "/etc/passwd"])
def test_malicious_listing_refused_before_anything_is_written(hub, k3, tmp_path, evil):
    hub.extra_listing = [{"type": "file", "oid": "0" * 40, "size": 3, "path": evil}]
    dest = tmp_path / "deep" / "model"
    rc, out, err = k3(*setup_args(dest))
    assert rc == 2 and repr(evil) in err and "refusing to write anything" in err
    assert not any("/resolve/" in r[1] for r in hub.requests)
    assert not (tmp_path / "deep" / "x.safetensors").exists()
    assert [p.name for p in dest.iterdir() if not p.name.startswith(".k3-setup")] == []


TOKEN = "hf_SECRETtokenNEVERshown123"


def everything_written(dest, *outputs) -> str:
    text = "".join(outputs)
    for p in dest.rglob("*"):
        if p.is_file() and p.suffix in ("", ".json", ".log"):
            text += p.read_text(errors="replace")
    return text


def test_401_explains_hf_token(hub, k3, tmp_path):
    hub.token = TOKEN
    rc, out, err = k3(*setup_args(tmp_path / "model"))
    assert rc == 2
    assert "needs a Hugging Face access token" in err and "HF_TOKEN" in err and "settings/tokens" in err


def test_wrong_token_refused_and_never_shown(hub, k3, tmp_path, monkeypatch):
    hub.token = TOKEN
    wrong = "hf_WRONGtokenALSOsecret456"
    monkeypatch.setenv("HF_TOKEN", wrong)
    dest = tmp_path / "model"
    rc, out, err = k3(*setup_args(dest))
    assert rc == 2 and "refused the token from HF_TOKEN" in err
    assert wrong not in everything_written(dest, out, err)


def test_token_is_used_and_never_shown(hub, k3, tmp_path, monkeypatch):
    hub.token = TOKEN
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    dest = tmp_path / "model"
    rc, out, err = k3(*setup_args(dest))
    assert rc == 0, err
    assert f"Bearer {TOKEN}" in hub.auth_seen
    assert TOKEN not in everything_written(dest, out, err)
    assert TOKEN not in (tmp_path / "k3-config" / "profile.json").read_text()


def test_401_on_the_files_themselves(hub, k3, tmp_path):
    hub.token, hub.token_for_files_only = TOKEN, True
    rc, out, err = k3(*setup_args(tmp_path / "model"))
    assert rc == 2 and "needs a Hugging Face access token" in err and "HF_TOKEN" in err


def test_token_asked_once_when_interactive(hub):
    hub.token = TOKEN
    asked = []
    h = Hub(REPO, ask_token=lambda: asked.append(1) or TOKEN)
    assert h.resolve("main") == hub.sha and asked == [1]
    assert h.token_from == "the prompt" and h.listing(hub.sha)
    wrong = Hub(REPO, ask_token=lambda: "hf_nope")
    with pytest.raises(HubError, match="refused the token from the prompt"):
        wrong.resolve("main")
