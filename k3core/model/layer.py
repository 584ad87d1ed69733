"""One decoder layer (MODEL.md §4.1): AttnRes in, attention, AttnRes, then the dense MLP or the latent MoE.

The engine runs it once per layer of a pass; a test runs it alone on a layer's weights.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .attnres import Residual, fold
from .mlp import dense_mlp
from .moe import latent_moe, prefetch_guess

if TYPE_CHECKING:
    from ..format.config import Config
    from ..interfaces import AttentionBackend, ExpertStore, KernelBackend, Weights
    from .observer import Observer


def decoder_layer(L: int, w: Weights, stream: Residual, segments: Sequence[tuple[int, int, Any]], c: Config,
                  kr: KernelBackend, attention: AttentionBackend, store: ExpertStore,
                  observers: Sequence[Observer] = (), cache_only: bool = False) -> None:
    """One layer (MODEL.md §4.1): AttnRes in, attention, AttnRes, MLP or latent MoE; updates `stream`.
    `segments`: (start, stop, layer state) of each sequence's rows; only attention tells them apart. `cache_only` (a
    draft model's --draft-cache-only): route only to the experts the store holds, and read nothing ahead."""
    h = stream.mix(kr, fold(w, "self_attention_res"), c.rms_norm_eps) if stream.blocks else stream.prefix
    if L % c.attn_res_block_size == 0:
        stream.close_block()  # the snapshot is the layer's INPUT prefix
    allowed = None
    if cache_only and not c.is_dense(L):
        allowed = np.zeros(c.num_experts, bool)
        allowed[list(store.held(L))] = True
    elif not c.is_dense(L):
        prefetch_guess(w, h, L, c, kr, store)  # the expert reads overlap the attention below
    x = kr.rmsnorm(h, w.vec("input_layernorm.weight"), c.rms_norm_eps)
    if len(segments) == 1:
        stream.add(attention.forward(w, x, segments[0][2], c, kr))
    else:
        stream.add(attention.forward_batch(w, x, segments, c, kr))
    h = stream.mix(kr, fold(w, "mlp_res"), c.rms_norm_eps)
    x = kr.rmsnorm(h, w.vec("post_attention_layernorm.weight"), c.rms_norm_eps)
    stream.add(dense_mlp(w, x, c, kr) if c.is_dense(L) else latent_moe(w, x, L, c, kr, store, observers, allowed))
