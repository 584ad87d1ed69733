"""Gated multi-head latent attention (MODEL.md §4.3), NoPE, with a compact latent cache.

The cache keeps per position the normed 512-latent and the shared 64 k_rope (576 floats per
layer); attention runs in latent space by absorbing k_nope's projection into the query and
v's projection into the output, which is the same product in a different grouping.
"""
from __future__ import annotations

import numpy as np

from ..plugin_api import FLOAT, MATRIX, AttentionBackend, Param, TensorSpec, hookimpl


GROW = 256


class MLACache:
    """Per position the [latent | k_rope] row, float32, in one array that grows GROW rows at a time (at most
    GROW - 1 rows beyond what the memory plan counts; the copies on growth stay cheap next to attention)."""

    def __init__(self, width: int, keys: np.ndarray | None = None):
        self.rows = np.zeros((0, width), np.float32) if keys is None else np.array(keys, np.float32)
        self.n = len(self.rows)
        self.mark: int | None = None  # positions held at the last mark (speculation)

    @property
    def keys(self) -> np.ndarray:
        return self.rows[:self.n]

    def append(self, keys: np.ndarray) -> None:
        need = self.n + len(keys)
        if need > len(self.rows):
            grown = np.empty((-(-need // GROW) * GROW, keys.shape[1]), np.float32)
            grown[:self.n] = self.rows[:self.n]
            self.rows = grown
        self.rows[self.n:need] = keys
        self.n = need

    def __deepcopy__(self, memo):
        return MLACache(self.rows.shape[1], self.keys)


class MLA(AttentionBackend):
    kind = "mla"
    name = "mla"
    positional = ("keys",)  # a row per position: kept prefixes share them

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
        return MLACache(c.kv_lora_rank + c.qk_rope_head_dim)

    def state_bytes(self, c, layer, context):
        return 4 * (c.kv_lora_rank + c.qk_rope_head_dim) * context  # float32 [latent | k_rope] per position

    def state_arrays(self, cache):
        return {"keys": cache.keys}

    def state_from_arrays(self, c, layer, arrays):
        keys, width = arrays["keys"], c.kv_lora_rank + c.qk_rope_head_dim
        if keys.dtype != np.float32 or keys.ndim != 2 or keys.shape[1] != width:
            raise ValueError(f"layer {layer}: MLA cache of shape {keys.shape}, expected [n, {width}] float32")
        return MLACache(width, keys)

    def forward(self, w, x, cache, c, kr):
        return self.sequences(w, x, [(0, x.shape[0], cache)], c, kr)

    def forward_batch(self, w, x, segments, c, kr):
        return self.sequences(w, x, segments, c, kr)

    def sequences(self, w, x, segments, c, kr):
        """forward and forward_batch: one implementation for one sequence or several."""
        T, heads = x.shape[0], c.num_attention_heads
        nope, rope, lora, dv = c.qk_nope_head_dim, c.qk_rope_head_dim, c.kv_lora_rank, c.v_head_dim
        a = "self_attn."
        q_a = kr.rmsnorm(kr.linear(w[a + "q_a_proj.weight"], x), w.vec(a + "q_a_layernorm.weight"), c.rms_norm_eps)
        q = kr.linear(w[a + "q_b_proj.weight"], q_a).reshape(T, heads, nope + rope)  # per head [nope | rope]
        ckv = kr.linear(w[a + "kv_a_proj_with_mqa.weight"], x)  # [T, lora | rope]
        latent = kr.rmsnorm(ckv[:, :lora], w.vec(a + "kv_a_layernorm.weight"), c.rms_norm_eps)
        keys = np.concatenate([latent, ckv[:, lora:]], axis=1)  # k_rope is one vector shared by all heads

        kv_b = w[a + "kv_b_proj.weight"].data.reshape(heads, nope + dv, lora)  # per head [k_nope | v] rows
        dtype = w[a + "kv_b_proj.weight"].dtype
        q_lat = np.stack([kr.linear(Param(np.ascontiguousarray(kv_b[h, :nope].T), dtype),
                                    np.ascontiguousarray(q[:, h, :nope])) for h in range(heads)], axis=1)
        query = np.concatenate([q_lat, q[:, :, nope:]], axis=2)  # [T, heads, lora | rope]; no rotation anywhere
        scale = (nope + rope) ** -0.5  # the rope dims count: 192^-½, not 128^-½
        ctx = np.empty((T, heads, lora), np.float32)
        for start, stop, cache in segments:
            cache.append(keys[start:stop])
            cached = cache.keys
            values = np.ascontiguousarray(cached[:, :lora])
            before = cache.n - (stop - start)
            for t in range(start, stop):  # causal: position t sees the cache up to and including itself
                seen = before + t - start + 1
                ctx[t] = kr.mqa_attention(query[t], cached[:seen], values[:seen], scale)
        out = np.concatenate([kr.linear(Param(np.ascontiguousarray(kv_b[h, nope:]), dtype), ctx[:, h])
                              for h in range(heads)], axis=1)  # [T, heads * dv]
        if c.mla_use_output_gate:
            out = kr.mul_sigmoid(out, kr.linear(w[a + "g_proj.weight"], x))  # gate, no norm
        return kr.linear(w[a + "o_proj.weight"], out)

    def mark(self, cache):
        cache.mark = cache.n

    def rollback(self, cache, kept, c, kr):
        if cache.mark is not None:
            cache.n, cache.mark = cache.mark + kept, None

    def rollback_bytes(self, c, layer, positions):
        return 0  # the cache is truncated; the rows past the mark are already counted at max_context


@hookimpl(trylast=True)
def k3_attention_backends():
    return [MLA()]
