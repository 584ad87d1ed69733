"""Verification: a shard damaged on disk is caught by its hash and only that shard is fetched again (found by
`k3 verify` after setup, or by setup's own verify step); the published size table; git blob ids."""
from __future__ import annotations

import hashlib
import os

from wizard.steps import Setup
from wizard.verify import Digest, published_sizes

from .conftest import REPO, setup_args, state_of

SHARD = "model-00007-of-000012.safetensors"


def corrupt(path):
    with open(path, "r+b") as f:
        f.seek(1000)
        b = f.read(1)
        f.seek(1000)
        f.write(bytes([b[0] ^ 0xFF]))


def test_verify_names_the_bad_shard_and_setup_fetches_only_it(hub, k3, tmp_path, small_files):
    dest = tmp_path / "model"
    assert k3(*setup_args(dest))[0] == 0
    assert k3("verify", dest)[0] == 0
    corrupt(dest / SHARD)
    rc, out, _ = k3("verify", dest)
    assert rc == 2
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("BAD")] == [f"BAD  {SHARD}"]
    assert "sha256" in out and "to fetch again" in out
    before = dict(hub.served)
    rc, out, err = k3(*setup_args(dest))
    assert rc == 0, err
    fetched = {n: hub.served[n] - before.get(n, 0) for n in hub.served if hub.served[n] != before.get(n, 0)}
    assert fetched == {SHARD: len(small_files[SHARD])}
    assert (dest / SHARD).read_bytes() == small_files[SHARD]
    assert k3("verify", dest)[0] == 0


def test_setup_verify_step_catches_damage_and_refetches_only_it(hub, k3, tmp_path, small_files, monkeypatch):
    dest = tmp_path / "model"
    with monkeypatch.context() as m:
        m.setattr(Setup, "step_verify", lambda self: (_ for _ in ()).throw(KeyboardInterrupt))
        assert k3(*setup_args(dest))[0] == 130
    corrupt(dest / SHARD)
    before = dict(hub.served)
    rc, out, err = k3(*setup_args(dest))
    assert rc == 0, err
    assert f"BAD {SHARD}: sha256" in out and f"fetched again: {SHARD}" in out
    assert {n: hub.served[n] - before.get(n, 0) for n in hub.served if hub.served[n] != before.get(n, 0)} == {
        SHARD: len(small_files[SHARD])}


def test_missing_file_and_unfinished_download_are_named(hub, k3, tmp_path):
    dest = tmp_path / "model"
    assert k3(*setup_args(dest, f"hf://{REPO}", "--no-pack"))[0] == 0
    os.unlink(dest / "tiktoken.model")
    rc, out, _ = k3("verify", dest)
    assert rc == 2 and "BAD  tiktoken.model: missing" in out


def test_verify_against_the_published_table(k3, tmp_path):
    dest = tmp_path / "released"
    dest.mkdir()
    sizes = published_sizes()
    assert len(sizes) == 96 and sum(sizes.values()) == 1_560_936_091_448       # MODEL.md §1
    wrong = "model-00042-of-000096.safetensors"
    for name, size in sizes.items():
        with open(dest / name, "wb") as f:                                       # sparse: no disk used
            f.truncate(size - (1 if name == wrong else 0))
    rc, out, _ = k3("verify", dest)
    assert rc == 2
    assert f"BAD  {wrong}: {sizes[wrong] - 1} bytes, the published table says {sizes[wrong]}" in out
    assert "published shard-size table" in out
    assert not [line for line in out.splitlines() if line.startswith("BAD  model-") and wrong not in line]


def test_official_listing_must_match_the_table(hub, k3, tmp_path, small_files):
    hub.add_repo("moonshotai/Kimi-K3", small_files)
    rc, _, err = k3(*setup_args(tmp_path / "model", "hf://moonshotai/Kimi-K3"))
    assert rc == 2 and "disagrees with the published shard sizes" in err
    assert not any("/resolve/" in r[1] for r in hub.requests)


def test_git_blob_id():
    data = b"hello\n"
    d = Digest("git-sha1", len(data))
    d.update(data)
    assert d.hexdigest() == "ce013625030ba8dba906f756967f9e9ca394464a"       # `git hash-object` of "hello\n"
    assert hashlib.sha1(b"blob 6\0hello\n").hexdigest() == d.hexdigest()


def test_state_records_no_token_and_is_versioned(hub, k3, tmp_path):
    dest = tmp_path / "model"
    assert k3(*setup_args(dest, f"hf://{REPO}", "--no-pack"))[0] == 0
    st = state_of(dest)
    assert (st["format"], st["version"]) == ("k3-setup-state", 1)
    (dest / ".k3-setup.json").write_text('{"format": "k3-setup-state", "version": 99}')
    rc, _, err = k3(*setup_args(dest, f"hf://{REPO}", "--no-pack"))
    assert rc == 2 and "state version 99" in err


def test_verify_checks_the_headers_against_the_config(k3, tiny_model, tmp_path):
    import json
    import shutil

    model = shutil.copytree(tiny_model, tmp_path / "m")
    config = json.loads((model / "config.json").read_text())
    config["text_config"]["num_experts"] = 9  # the shards hold 8 per layer
    (model / "config.json").write_text(json.dumps(config))
    rc, out, _ = k3("verify", model)
    assert rc == 2 and "BAD  (checkpoint)" in out and "num_experts 9: layer 1 has tensors for experts 0..7 and none " \
        "for expert 8" in out


def test_verify_deep_names_non_finite_weights_and_warns_of_255_scales(k3, tiny_model, tmp_path):
    import shutil

    import numpy as np

    from k3core.format.checkpoint import layer_prefix, open_checkpoint

    model = shutil.copytree(tiny_model, tmp_path / "m")
    rc, out, _ = k3("verify", model, "--deep")
    assert rc == 0 and "WARN language_model.model.layers.1.block_sparse_moe.experts.1.w2.weight_scale: 1 scale " \
        "byte(s) of 255" in out and "every weight read (--deep)" in out
    name = layer_prefix(2) + "self_attn.q_proj.weight"
    ckpt = open_checkpoint(model)
    info = ckpt.index[name]
    ckpt.close()
    with open(info.file, "r+b") as f:
        f.seek(info.offset + 2 * 7)
        f.write(np.array(0x7F80, "<u2").tobytes())  # BF16 +inf
    rc, out, _ = k3("verify", model, "--deep")
    assert rc == 2 and f"BAD  (weights) {name}: 1 NaN or infinite value(s)" in out
