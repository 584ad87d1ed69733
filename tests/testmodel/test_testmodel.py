"""The test-model generator: real format (names, dtypes, shards, index json, MXFP4 layout),
deterministic bytes, both config layouts, and weights that exercise MODEL.md §9's traps."""
import hashlib
import json

import numpy as np
import pytest
from safetensors import safe_open

from k3core.format import mxfp4
from k3core.format.checkpoint import check_binding, expert_prefix, open_checkpoint
from k3core.format.config import load_config
from k3core.errors import UsageError
from k3core.plugins.kda import KDA
from k3core.plugins.mla import MLA
from k3core.testmodel.make import make_model

from .testmodel_digests import TINY_SEED0


def digest(directory):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_same_seed_gives_the_same_bytes(tmp_path, tiny_model):
    again = make_model(tmp_path / "again", "tiny", 0)
    assert digest(again) == digest(tiny_model)


def test_tiny_seed0_bytes_are_pinned(tiny_model):
    assert digest(tiny_model) == TINY_SEED0


def test_another_seed_gives_other_weights(tmp_path, tiny_model):
    other = digest(make_model(tmp_path / "other", "tiny", 1))
    ours = digest(tiny_model)
    assert other["config.json"] == ours["config.json"]
    assert other["model-00002-of-000015.safetensors"] != ours["model-00002-of-000015.safetensors"]


@pytest.mark.parametrize("shape", ["tiny", "small"])
def test_generated_checkpoints_bind_to_their_config(model_factory, shape):
    ckpt = open_checkpoint(model_factory(shape))
    attention = {False: KDA(), True: MLA()}
    check_binding(ckpt, lambda L: attention[ckpt.config.is_mla(L)])


def test_shards_follow_the_released_layout(tiny_model):
    c = load_config(tiny_model)
    index = json.loads((tiny_model / "model.safetensors.index.json").read_text())["weight_map"]
    assert index["language_model.model.layers.0.input_layernorm.weight"] == "model-00001-of-000015.safetensors"
    assert index["language_model.model.layers.5.block_sparse_moe.experts.7.w2.weight_packed"] == \
        "model-00006-of-000015.safetensors"
    assert index["language_model.lm_head.weight"] == "model-00014-of-000015.safetensors"
    assert index["vision_tower.patch_embed.weight"] == "model-00015-of-000015.safetensors"
    ckpt = open_checkpoint(tiny_model)
    for layer in range(c.first_k_dense_replace, c.num_hidden_layers):  # each expert: one gap-free run
        for e in range(c.num_experts):
            infos = [ckpt.index[expert_prefix(layer, e) + p] for p in
                     ("w1.weight_packed", "w1.weight_scale", "w2.weight_packed", "w2.weight_scale",
                      "w3.weight_packed", "w3.weight_scale")]
            assert all(a.offset + a.nbytes == b.offset for a, b in zip(infos, infos[1:]))


def test_the_official_safetensors_library_reads_every_shard(tiny_model):
    names = set()
    for shard in sorted(tiny_model.glob("*.safetensors")):
        with safe_open(shard, framework="numpy") as f:
            names |= set(f.keys())
    assert names == set(json.loads((tiny_model / "model.safetensors.index.json").read_text())["weight_map"])


def test_flat_layout_loads_the_same_config(model_factory):
    assert load_config(model_factory("tiny", layout="flat")).to_dict() | {"layout": 0} == \
        load_config(model_factory("tiny")).to_dict() | {"layout": 0}


def test_weights_exercise_the_traps(tiny_model):
    ckpt = open_checkpoint(tiny_model)
    c = ckpt.config
    read = ckpt.index.read
    a_log = read("language_model.model.layers.0.self_attn.A_log")
    assert len(np.unique(a_log[:c.kda_num_heads])) == c.kda_num_heads and not a_log[c.kda_num_heads:].any()
    bias = read("language_model.model.layers.1.block_sparse_moe.gate.e_score_correction_bias")
    assert np.ptp(bias) > 0.3
    nan_groups = 0
    for layer in range(1, c.num_hidden_layers):
        for e in range(c.num_experts):
            for w in ("w1", "w2", "w3"):
                assert read(expert_prefix(layer, e) + f"{w}.weight_packed").any()
                nan_groups += mxfp4.count_nan_scales(read(expert_prefix(layer, e) + f"{w}.weight_scale"))
    assert nan_groups == 1


def test_refuses_to_overwrite_without_force(tmp_path):
    target = make_model(tmp_path / "m", "tiny", 0)
    with pytest.raises(UsageError, match="--force"):
        make_model(target, "tiny", 1)
    assert make_model(target, "tiny", 0, if_missing=True) == target
    (tmp_path / "other").mkdir()
    with pytest.raises(UsageError, match="not this test model"):
        make_model(tmp_path / "other", "tiny", 0, if_missing=True)
