"""The latent mixture of experts (MODEL.md §4.4): router, experts in the latent, shared experts.

Router on the full hidden width; experts run in a 3584-wide latent; the weighted aggregate
is normed once; the shared experts see the original x and are added unweighted.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..interfaces import ExpertStore, KernelBackend, Weights
from .mlp import dense_mlp

if TYPE_CHECKING:
    from ..format.config import Config
    from .observer import Observer

P = "block_sparse_moe."


def route(w: Weights, x: np.ndarray, c: Config, kr: KernelBackend, allowed: np.ndarray | None = None,
          k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(expert ids [T, k] in rank order, combine weights [T, k]) for x [T, H]. `allowed` (a draft model's
    --draft-cache-only: bool [E]) keeps selection to those experts, k at most their number (k may be 0). `k`: the
    model's num_experts_per_token unless given (a prefetch guess ranks further down)."""
    logits = kr.linear(w[P + "gate.weight"], x)  # the router reads the FULL hidden width
    bias = w.vec(P + "gate.e_score_correction_bias")  # selection only; weights stay unbiased
    k = c.num_experts_per_token if k is None else k
    if allowed is not None:
        k = min(k, int(allowed.sum()))
        if k == 0:
            return np.zeros((x.shape[0], 0), np.int64), np.zeros((x.shape[0], 0), np.float32)
        bias = np.where(allowed, bias, -np.inf).astype(np.float32)
    return kr.router(logits, bias, k, c.moe_renormalize, c.routed_scaling_factor)


def prefetch_guess(w: Weights, h: np.ndarray, layer: int, c: Config, kr: KernelBackend, store: ExpertStore) -> None:
    """Tell the store which experts this layer will probably route to, from the residual mix `h` before
    the attention (the router reads the mix after it). Only a read hint: nothing computed here reaches
    the stream, and a fetch serves the same bytes whether the guess was right or not."""
    room = store.prefetch_capacity()
    if room <= 0:
        return
    x = kr.rmsnorm(h, w.vec("post_attention_layernorm.weight"), c.rms_norm_eps)
    ranked = min(c.num_experts, max(c.num_experts_per_token, -(-room // len(x))))  # a deeper prefetch: more per token
    ids, _ = route(w, x, c, kr, k=ranked)
    guess = dict.fromkeys(int(e) for e in ids.T.flat)  # every token's first choice, then every second, …
    store.prefetch(layer, list(guess)[:room])


def latent_moe(w: Weights, x: np.ndarray, layer: int, c: Config, kr: KernelBackend, store: ExpertStore,
               observers: Sequence[Observer] = (), allowed: np.ndarray | None = None) -> np.ndarray:
    ids, weights = route(w, x, c, kr, allowed)
    for o in observers:
        o.on_route(layer, ids)
    # everything that needs no routed expert runs first, while the prefetched expert reads land
    shared = dense_mlp(w, x, c, kr, P + "shared_experts.") if c.num_shared_experts else None  # original x
    if ids.shape[1] == 0:  # a cache-only draft with no expert of this layer held: the routed part adds nothing
        return shared if shared is not None else np.zeros_like(x)
    z = kr.linear(w[P + "routed_expert_down_proj.weight"], x)  # H → latent
    outs = np.empty((x.shape[0], ids.shape[1], z.shape[1]), np.float32)  # [T, k, latent]
    wanted = sorted({int(e) for e in ids.flat})  # each expert read once for all the tokens that chose it
    for batch in store.fetch_batches(layer, wanted):  # a store may read the next batch while this one computes
        for e in batch:
            tokens, ranks = np.nonzero(ids == e.expert)
            outs[tokens, ranks] = kr.expert(e, z[tokens], c.situ_beta, c.situ_linear_beta)  # per-token bits
    agg = np.stack([kr.combine(list(outs[t]), weights[t]) for t in range(x.shape[0])])  # rank order
    if c.latent_moe_use_norm:
        agg = kr.rmsnorm(agg, w.vec(P + "routed_expert_norm.weight"), c.rms_norm_eps)  # the AGGREGATE, once
    out = kr.linear(w[P + "routed_expert_up_proj.weight"], agg)
    return out if shared is None else out + shared  # the shared experts: unweighted
