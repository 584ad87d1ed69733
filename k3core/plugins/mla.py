"""Gated multi-head latent attention (SPEC §4.3), NoPE, with a compact latent cache.

The cache keeps per position the normed 512-latent and the shared 64 k_rope (576 floats per
layer); attention runs in latent space by absorbing k_nope's projection into the query and
v's projection into the output, which is the same product in a different grouping.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..plugin_api import FLOAT, MATRIX, AttentionBackend, Param, TensorSpec, hookimpl


@dataclass
class MLACache:
    keys: list = field(default_factory=list)  # per position: [latent | k_rope] float32 [kv_lora + rope]

    def __deepcopy__(self, memo):
        return MLACache([k.copy() for k in self.keys])


class MLA(AttentionBackend):
    kind = "mla"
    name = "mla"

    def tensor_specs(self, c, layer):
        H, h = c.hidden_size, c.num_attention_heads
        a = "self_attn."
        specs = [
            TensorSpec(a + "q_a_proj.weight", (c.q_lora_rank, H), MATRIX),
            TensorSpec(a + "q_a_layernorm.weight", (c.q_lora_rank,), FLOAT),
            TensorSpec(a + "q_b_proj.weight", (h * c.qk_head_dim, c.q_lora_rank), MATRIX),
            TensorSpec(a + "kv_a_proj_with_mqa.weight", (c.kv_lora_rank + c.qk_rope_head_dim, H), MATRIX),
            TensorSpec(a + "kv_a_layernorm.weight", (c.kv_lora_rank,), FLOAT),
            TensorSpec(a + "kv_b_proj.weight", (h * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank), MATRIX),
            TensorSpec(a + "o_proj.weight", (H, h * c.v_head_dim), MATRIX),
        ]
        if c.mla_use_output_gate:
            specs.append(TensorSpec(a + "g_proj.weight", (h * c.v_head_dim, H), MATRIX))
        return specs

    def new_state(self, c, layer):
        return MLACache()

    def state_bytes(self, c, layer, context):
        return 4 * (c.kv_lora_rank + c.qk_rope_head_dim) * context  # float32 [latent | k_rope] per position

    def state_arrays(self, cache):
        width = len(cache.keys[0]) if cache.keys else 0
        return {"keys": np.stack(cache.keys) if cache.keys else np.zeros((0, width), np.float32)}

    def state_from_arrays(self, c, layer, arrays):
        keys = arrays["keys"]
        if keys.dtype != np.float32 or (len(keys) and keys.shape[1] != c.kv_lora_rank + c.qk_rope_head_dim):
            raise ValueError(f"layer {layer}: MLA cache of shape {keys.shape}, expected [n, "
                             f"{c.kv_lora_rank + c.qk_rope_head_dim}] float32")
        return MLACache([k.copy() for k in keys])

    def forward(self, w, x, cache, c, kr):
        T, heads = x.shape[0], c.num_attention_heads
        nope, rope, lora, dv = c.qk_nope_head_dim, c.qk_rope_head_dim, c.kv_lora_rank, c.v_head_dim
        a = "self_attn."
        q_a = kr.rmsnorm(kr.linear(w[a + "q_a_proj.weight"], x), w.vec(a + "q_a_layernorm.weight"), c.rms_norm_eps)
        q = kr.linear(w[a + "q_b_proj.weight"], q_a).reshape(T, heads, nope + rope)  # per head [nope | rope]
        ckv = kr.linear(w[a + "kv_a_proj_with_mqa.weight"], x)  # [T, lora | rope]
        latent = kr.rmsnorm(ckv[:, :lora], w.vec(a + "kv_a_layernorm.weight"), c.rms_norm_eps)
        keys = np.concatenate([latent, ckv[:, lora:]], axis=1)  # k_rope is one vector shared by all heads

        kv_b = w[a + "kv_b_proj.weight"].data.reshape(heads, nope + dv, lora)  # per head [k_nope | v] rows
        k_nope_t = [Param(np.ascontiguousarray(kv_b[h, :nope].T), w[a + "kv_b_proj.weight"].dtype) for h in range(heads)]
        v_proj = [Param(np.ascontiguousarray(kv_b[h, nope:]), w[a + "kv_b_proj.weight"].dtype) for h in range(heads)]
        scale = (nope + rope) ** -0.5  # the rope dims count: 192^-½, not 128^-½
        out = np.empty((T, heads * dv), np.float32)
        for t in range(T):
            cache.keys.append(keys[t])
            q_lat = np.concatenate([kr.linear(k_nope_t[h], q[t, h:h + 1, :nope]) for h in range(heads)])  # [heads, lora]
            query = np.concatenate([q_lat, q[t, :, nope:]], axis=1)  # no rotation anywhere
            cached = np.stack(cache.keys)
            ctx = kr.mqa_attention(query, cached, np.ascontiguousarray(cached[:, :lora]), scale)  # [heads, lora]
            out[t] = np.concatenate([kr.linear(v_proj[h], ctx[h:h + 1])[0] for h in range(heads)])
        if c.mla_use_output_gate:
            out = kr.mul_sigmoid(out, kr.linear(w[a + "g_proj.weight"], x))  # gate, no norm
        return kr.linear(w[a + "o_proj.weight"], out)


@hookimpl(trylast=True)
def k3_attention_backends():
    return [MLA()]
