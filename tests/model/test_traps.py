"""Each trap of docs/MODEL.md, broken on purpose, makes a gate fail: the gates can tell a model that talks
from a model that is right. The engine's own code is untouched; the breakage lives here."""
import numpy as np
import pytest

import k3core.model.layer
from k3core.model import moe
from k3core import EngineConfig, open_engine
from k3core.model.mlp import dense_mlp
from k3core.plugins.reference_kernels import ReferenceKernels, _f64, _sigmoid64

from .test_gates import gate1, gate_decode, oracle, TOLERANCE


class APerChannel(ReferenceKernels):
    """A_log read per channel: channel h·D+d uses A_log[h·D+d] (zero padding past `heads`)."""

    def kda_decay(self, z, a_log, dt_bias, lower_bound):
        T, heads, D = z.shape
        padded = np.zeros(heads * D)
        padded[:heads] = a_log
        rate = np.exp(padded).reshape(1, heads, D)
        zz = _f64(z) + _f64(dt_bias).reshape(heads, D)
        return np.exp(lower_bound * _sigmoid64(rate * zz)).astype(np.float32)


class CappedSigmoid(ReferenceKernels):
    """SiTU's sigmoid fed the capped gate instead of the raw one."""

    def situ_glu(self, g, u, beta, linear_beta):
        capped = beta * np.tanh(_f64(g) / beta)
        return (capped * _sigmoid64(capped) * linear_beta * np.tanh(_f64(u) / linear_beta)).astype(np.float32)


class BiasedCombine(ReferenceKernels):
    """Combine weights taken from the biased scores."""

    def router(self, logits, bias, top_k, renormalize, scaling):
        ids, _ = super().router(logits, bias, top_k, renormalize, scaling)
        w = np.take_along_axis(_sigmoid64(_f64(logits)) + _f64(bias), ids, axis=1)
        return ids, (w / (w.sum(axis=1, keepdims=True) + 1e-20) * scaling).astype(np.float32)


class RopeDropped(ReferenceKernels):
    """MLA scores from the latent (nope) part only; the 64 rope dims ignored."""

    def mqa_attention(self, q, keys, values, scale):
        d = values.shape[1]
        return super().mqa_attention(np.ascontiguousarray(q[:, :d]), np.ascontiguousarray(keys[:, :d]), values, scale)


class NopeOnlyScale(ReferenceKernels):
    """MLA scale nope^-½ (the 128^-½ trap) instead of (nope+rope)^-½."""

    def __init__(self, config):
        self.factor = ((config.qk_nope_head_dim + config.qk_rope_head_dim) / config.qk_nope_head_dim) ** 0.5

    def mqa_attention(self, q, keys, values, scale):
        return super().mqa_attention(q, keys, values, scale * self.factor)


class GateBeforeNorm(ReferenceKernels):
    """KDA output gated first and normed second."""

    def __init__(self, config):
        self.D, self.pending = config.kda_head_dim, None

    def rmsnorm(self, x, w, eps):
        if x.shape[-1] == self.D and self.pending is None:  # the head-wise o_norm: defer it
            self.pending = (w, eps)
            return x
        return super().rmsnorm(x, w, eps)

    def mul_sigmoid(self, y, g):
        gated = super().mul_sigmoid(y, g)
        if self.pending is None:
            return gated
        (w, eps), self.pending = self.pending, None
        return super().rmsnorm(gated.reshape(-1, self.D), w, eps).reshape(gated.shape)


class ConvHistoryDropped(ReferenceKernels):
    """Decode forgets the last K-1 conv inputs."""

    def short_conv(self, x, history, w):
        return super().short_conv(x, np.zeros_like(history), w)


def per_expert_norm_moe(w, x, layer, c, kr, store, on_route=None, allowed=None):
    """The latent norm applied to each expert's output instead of to the aggregate."""
    ids, weights = moe.route(w, x, c, kr)
    z = kr.linear(w[moe.P + "routed_expert_down_proj.weight"], x)
    g = w.vec(moe.P + "routed_expert_norm.weight")
    agg = np.empty_like(z)
    for t in range(x.shape[0]):
        outs = [kr.rmsnorm(kr.expert(e, z[t:t + 1], c.situ_beta, c.situ_linear_beta), g, c.rms_norm_eps)
                for e in store.fetch(layer, [int(i) for i in ids[t]])]
        agg[t] = kr.combine(outs, weights[t])[0]
    out = kr.linear(w[moe.P + "routed_expert_up_proj.weight"], agg)
    return out + dense_mlp(w, x, c, kr, moe.P + "shared_experts.")


TRAPS = {
    "A_log per channel": lambda c: APerChannel(),
    "sigmoid of the capped gate": lambda c: CappedSigmoid(),
    "biased combine weights": lambda c: BiasedCombine(),
    "rope dims dropped": lambda c: RopeDropped(),
    "128^-1/2 scale": NopeOnlyScale,
    "KDA gate before norm": GateBeforeNorm,
    "conv history dropped in decode": lambda c: ConvHistoryDropped(),
}


def passes(result):
    ids_equal, err = result
    return ids_equal and err <= TOLERANCE


@pytest.fixture(scope="module", params=["tiny", "small"])
def setup(request, model_factory):
    with open_engine(EngineConfig(model_factory(request.param))) as engine:
        yield engine, oracle(request.param)[0]


@pytest.mark.parametrize("trap", list(TRAPS))
def test_a_broken_trap_fails_a_gate(setup, trap):
    engine, o = setup
    right = engine.kernels
    engine.kernels = TRAPS[trap](engine.config)
    try:
        results = [gate1(engine, o), gate_decode(engine, o, full_recompute=False)]
    finally:
        engine.kernels = right
    assert not all(passes(r) for r in results), results


def test_per_expert_latent_norm_fails_a_gate(setup, monkeypatch):
    engine, o = setup
    monkeypatch.setattr(k3core.model.layer, "latent_moe", per_expert_norm_moe)
    assert not passes(gate1(engine, o))


def test_dropped_conv_history_is_caught_only_by_incremental_decode(setup):
    engine, o = setup
    right, engine.kernels = engine.kernels, ConvHistoryDropped()
    try:
        assert passes(gate1(engine, o))  # a full pass never needs carried history
        assert not passes(gate_decode(engine, o, full_recompute=False))
    finally:
        engine.kernels = right
