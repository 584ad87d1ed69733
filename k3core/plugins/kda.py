"""Kimi Delta Attention (SPEC §4.2): linear attention with a fixed D×D state per head.

Per token: ShortConv'd q, k, v; per-head L2 norm of q, k; a per-channel decay α from one
shared low-rank pair; the delta-rule recurrence; head-wise RMSNorm, then the output gate.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..plugin_api import FLOAT, MATRIX, AttentionBackend, TensorSpec, hookimpl

L2_EPS = 1e-6


@dataclass
class KDAState:
    S: np.ndarray        # [heads, D, D] float32, starts at zero
    history: np.ndarray  # [3 (q, k, v), K-1, P] the last K-1 conv inputs, oldest first

    def __deepcopy__(self, memo):
        return KDAState(self.S.copy(), self.history.copy())


class KDA(AttentionBackend):
    kind = "kda"
    name = "kda"

    def tensor_specs(self, c, layer):
        H, P, D, K = c.hidden_size, c.kda_proj_dim, c.kda_head_dim, c.short_conv_kernel_size
        a = "self_attn."
        return [TensorSpec(a + n, (P, H), MATRIX) for n in
                ("q_proj.weight", "k_proj.weight", "v_proj.weight", "g_proj.weight")] + [
            TensorSpec(a + "o_proj.weight", (H, P), MATRIX),
            *(TensorSpec(a + f"{n}_conv1d.weight", (P, 1, K), FLOAT) for n in "qkv"),
            TensorSpec(a + "f_a_proj.weight", (D, H), MATRIX),
            TensorSpec(a + "f_b_proj.weight", (P, D), MATRIX),
            TensorSpec(a + "b_proj.weight", (c.kda_num_heads, H), MATRIX),
            TensorSpec(a + "A_log", None, FLOAT, min_numel=c.kda_num_heads),
            TensorSpec(a + "dt_bias", (P,), FLOAT),
            TensorSpec(a + "o_norm.weight", (D,), FLOAT),
        ]

    def new_state(self, c, layer):
        heads, D, P = c.kda_num_heads, c.kda_head_dim, c.kda_proj_dim
        return KDAState(np.zeros((heads, D, D), np.float32),
                        np.zeros((3, c.short_conv_kernel_size - 1, P), np.float32))

    def state_bytes(self, c, layer, context):
        return 4 * (c.kda_num_heads * c.kda_head_dim ** 2 + 3 * (c.short_conv_kernel_size - 1) * c.kda_proj_dim)

    def state_arrays(self, state):
        return {"S": state.S, "history": state.history}

    def state_from_arrays(self, c, layer, arrays):
        empty = self.new_state(c, layer)
        for name in ("S", "history"):
            if arrays[name].shape != getattr(empty, name).shape or arrays[name].dtype != np.float32:
                raise ValueError(f"layer {layer}: KDA {name} has shape {arrays[name].shape}, "
                                 f"expected {getattr(empty, name).shape} float32")
        return KDAState(arrays["S"].copy(), arrays["history"].copy())

    def forward(self, w, x, state, c, kr):
        T, heads, D = x.shape[0], c.kda_num_heads, c.kda_head_dim
        a = "self_attn."

        def conv_branch(i, name):  # Linear → causal conv → SiLU, carrying the conv history
            y, state.history[i] = kr.short_conv(kr.linear(w[a + f"{name}_proj.weight"], x), state.history[i],
                                                w.vec(a + f"{name}_conv1d.weight")[:, 0, :])
            return y

        q, k, v = conv_branch(0, "q"), conv_branch(1, "k"), conv_branch(2, "v")  # [T, P]
        q, k = kr.l2norm_heads(q, heads, L2_EPS), kr.l2norm_heads(k, heads, L2_EPS)  # sum, not mean
        beta = kr.sigmoid(kr.linear(w[a + "b_proj.weight"], x))  # [T, heads]
        z = kr.linear(w[a + "f_b_proj.weight"], kr.linear(w[a + "f_a_proj.weight"], x))  # one pair for all heads
        a_log = w.vec(a + "A_log").reshape(-1)[:heads]  # A_log is per head, not per channel
        alpha = kr.kda_decay(z.reshape(T, heads, D), a_log, w.vec(a + "dt_bias"), c.gate_lower_bound)
        o, state.S = kr.kda_recurrence(q.reshape(T, heads, D), k.reshape(T, heads, D), v.reshape(T, heads, D),
                                       alpha, beta, state.S, D ** -0.5)
        y = kr.rmsnorm(o.reshape(T * heads, D), w.vec(a + "o_norm.weight"), c.rms_norm_eps)  # norm first
        y = kr.mul_sigmoid(y.reshape(T, heads * D), kr.linear(w[a + "g_proj.weight"], x))  # then the gate
        return kr.linear(w[a + "o_proj.weight"], y)


@hookimpl(trylast=True)
def k3_attention_backends():
    return [KDA()]
