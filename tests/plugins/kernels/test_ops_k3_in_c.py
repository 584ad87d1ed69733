"""Every op case from kimi-k3-in-c's independent PyTorch reference, reproduced by k3's blocks on
the reference kernels within the manifest tolerances (router index sets exactly).

The cases are self-contained (weights, inputs, outputs); see tests/fixtures/k3-in-c/README.md.
"""
import json

import numpy as np
import pytest

from k3core.model.attnres import Residual
from k3core.format.config import Config
from k3core.model.layer import decoder_layer
from k3core.interfaces import ExpertStore, ExpertWeights, Param, Weights
from k3core.model.moe import latent_moe
from k3core.plugins.kda import KDA
from k3core.plugins.mla import MLA
from k3core.plugins.reference_kernels import ReferenceKernels

from ...conftest import K3_IN_C

OPS = K3_IN_C / "ops"
MANIFEST = json.loads((OPS / "MANIFEST.json").read_text())
ATOL, RTOL = MANIFEST["tolerance"]["fp32_abs"], MANIFEST["tolerance"]["fp32_rel"]
kr = ReferenceKernels()


def load(name):
    raw = json.loads((OPS / f"{name}.json").read_text())
    return {k: np.array(v["data"], np.float64).reshape(v["shape"]).astype(np.float32)
            if isinstance(v, dict) and "data" in v else v for k, v in raw.items()}


def fixture_config() -> Config:
    # The fixtures' config has moe_intermediate_size 48, which our validation refuses for MXFP4
    # experts (MODEL.md §2); these cases use float experts, so the dataclass is built directly.
    raw = {k: v for k, v in MANIFEST["config"].items() if k in Config.__dataclass_fields__}
    return Config(**{**raw, "full_attn_layers": tuple(raw["full_attn_layers"])})


def close(got, want):
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def f32(a):
    return Param(np.ascontiguousarray(a, np.float32), "F32")


def test_rmsnorm():
    d = load("rmsnorm")
    close(kr.rmsnorm(d["in"], d["weight"], d["eps"]), d["out"])


def test_situ_glu_saturates_both_caps():
    d = load("situ_glu")
    half = d["in"].shape[1] // 2
    out = kr.situ_glu(d["in"][:, :half], d["in"][:, half:], d["beta"], d["linear_beta"])
    close(out, d["out"])
    assert np.abs(out).max() <= 100.0


def test_shortconv_with_carried_history():
    d = load("shortconv")
    w = d["weight"][:, 0, :]
    y, history = kr.short_conv(d["in"][0], np.zeros((d["kernel"] - 1, d["channels"]), np.float32), w)
    close(y, d["out"][0])
    close(history.T, d["state_after"][0])  # fixture layout [C, K-1]
    y_next, _ = kr.short_conv(d["in_next"][0], history, w)
    close(y_next, d["out_next"][0])


def test_kda_decay_per_head_a_log():
    d = load("kda_decay")
    z = d["z"][0]
    heads = d["A_log"].shape[0]
    alpha = kr.kda_decay(z.reshape(z.shape[0], heads, -1), d["A_log"], d["dt_bias"], d["lower_bound"])
    close(alpha, d["alpha"][0])
    close(np.log(alpha.astype(np.float64)), d["g"][0])


@pytest.mark.parametrize("name", ["kda_recur1", "kda_recur8"])
def test_kda_recurrence(name):
    d = load(name)
    state = np.zeros((d["H"], d["d_k"], d["d_v"]), np.float32)
    out, state = kr.kda_recurrence(d["q"], d["k"], d["v"], d["alpha"], d["beta"], state, d["q_scale"])
    close(out, d["out"])
    close(state, d["state_out"])


def test_router_index_sets_exact_with_a_reordering_bias():
    d = load("router")
    assert d["rows_where_bias_changed_selection"] > 0
    ids, weights = kr.router(kr.linear(f32(d["gate_weight"]), d["in"]), d["bias"], d["top_k"], True, 1.0)
    want_ids = d["topk_idx"].astype(np.int64)
    assert [set(r) for r in ids] == [set(r) for r in want_ids]
    order, want_order = np.argsort(ids, axis=1), np.argsort(want_ids, axis=1)
    close(np.take_along_axis(weights, order, 1), np.take_along_axis(d["topk_weight"], want_order, 1))


def test_attnres_nine_sources():
    d = load("attnres")
    blocks = d["block_residual"]
    sources = [blocks[:, i] for i in range(blocks.shape[1])] + [d["prefix_sum"]]
    fold = d["norm_weight"].astype(np.float64) * d["proj_weight"]
    close(kr.attnres(sources, fold, d["eps"]), d["out"])


MLA_NAMES = ["q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj",
             "o_proj", "g_proj"]


def test_mla_and_its_latent_cache():
    d = load("mla")
    w = Weights("", {f"self_attn.{n}.weight": f32(d[f"{n}_weight"]) for n in MLA_NAMES})
    cache = MLA().new_state(fixture_config(), 3)
    close(MLA().forward(w, d["in"][0], cache, fixture_config(), kr), d["out"][0])
    keys = np.stack(cache.keys)
    close(keys[:, :d["kv_lora"]], d["kv_latent"][0])
    close(keys[:, d["kv_lora"]:], d["k_rope"][0])


KDA_NAMES = {"q_proj": "q_proj.weight", "k_proj": "k_proj.weight", "v_proj": "v_proj.weight",
             "g_proj": "g_proj.weight", "o_proj": "o_proj.weight", "f_a": "f_a_proj.weight",
             "f_b": "f_b_proj.weight", "b_proj": "b_proj.weight", "q_conv": "q_conv1d.weight",
             "k_conv": "k_conv1d.weight", "v_conv": "v_conv1d.weight", "A_log": "A_log", "dt_bias": "dt_bias",
             "o_norm": "o_norm.weight"}


@pytest.mark.parametrize("name", ["kda_layer1", "kda_layer8"])
def test_kda_attention_block(name):
    d = load(name)
    w = Weights("", {f"self_attn.{ours}": f32(d[theirs]) for theirs, ours in KDA_NAMES.items()})
    state = KDA().new_state(fixture_config(), 1)
    close(KDA().forward(w, d["in"][0], state, fixture_config(), kr), d["out"][0])
    close(state.S, d["state_out"][0])


class FloatExpertKernels(ReferenceKernels):
    """The fixtures' experts are float weights, not MXFP4: run them through the same kernels."""

    def __init__(self, table):
        self.table = table

    def expert(self, e, z, beta, linear_beta):
        w1, w2, w3 = self.table[e.expert]
        return self.linear(w2, self.situ_glu(self.linear(w1, z), self.linear(w3, z), beta, linear_beta))


class HandleStore(ExpertStore):
    """Hands out experts by number only: the kernels above look their weights up in the fixture's table."""

    name = "handles"

    def __init__(self):  # no checkpoint behind it
        pass

    def capacity(self):
        return 8

    def prefetch_capacity(self):
        return 0  # takes no hints

    def fetch(self, layer, experts):
        return [ExpertWeights(layer, e, *([None] * 6)) for e in experts]


def moe_weights(d, pre, n_experts):
    p = "block_sparse_moe."
    names = {"gate.weight": "gate_weight", "gate.e_score_correction_bias": "e_score_correction_bias",
             "routed_expert_down_proj.weight": "down_weight", "routed_expert_up_proj.weight": "up_weight",
             "routed_expert_norm.weight": "norm_weight", "shared_experts.gate_proj.weight": "shared_w1_weight",
             "shared_experts.up_proj.weight": "shared_w3_weight", "shared_experts.down_proj.weight": "shared_w2_weight"}
    params = {p + ours: f32(d[pre + theirs]) for ours, theirs in names.items()}
    table = {e: tuple(f32(d[f"{pre}experts_{e}_{k}_weight"]) for k in ("w1", "w2", "w3")) for e in range(n_experts)}
    return params, table


def test_latent_moe():
    d = load("moe")
    params, table = moe_weights(d, "", d["n_experts"])
    out = latent_moe(Weights("", params), d["in"][0], 1, fixture_config(), FloatExpertKernels(table), HandleStore())
    # Outputs reach ~177 and one element cancels to ~0.013: the fixture's own float32 rounding is
    # ~1e-5 there, so this case is held to the gates' norm, 1e-4 × max|ref| (k3 got 2.6e-7).
    err = np.abs(out - d["out"][0]).max() / np.abs(d["out"][0]).max()
    assert err <= 1e-4, err


RESIDUAL = ["input_layernorm", "post_attention_layernorm", "self_attention_res_norm", "self_attention_res_proj",
            "mlp_res_norm", "mlp_res_proj"]


@pytest.mark.parametrize("name", ["layer_kda", "layer_mla"])
def test_decoder_layer_with_attnres_blocks(name):
    d = load(name)
    c = fixture_config()
    params, table = moe_weights(d, "mlp_", c.num_experts)
    params.update({f"{n}.weight": f32(d[f"{n}_weight"]) for n in RESIDUAL})
    for key, value in d.items():
        if key.startswith("self_attn_"):
            rest = key[len("self_attn_"):]
            params["self_attn." + (rest[:-len("_weight")] + ".weight" if rest.endswith("_weight") else rest)] = f32(value)
    layer = d["layer_idx"]
    attention = MLA() if d["is_mla"] else KDA()
    assert c.is_mla(layer) == d["is_mla"]
    stream = Residual(d["in"][0])
    stream.blocks = [d["block_residual_in"][:, i] for i in range(d["block_residual_in"].shape[1])]
    decoder_layer(layer, Weights("", params), stream, [(0, len(d["in"][0]), attention.new_state(c, layer))], c,
                  FloatExpertKernels(table), attention, HandleStore())
    close(stream.prefix, d["out"][0])
    np.testing.assert_array_equal(np.stack(stream.blocks, axis=1), d["block_residual_out"])
