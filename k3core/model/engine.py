"""The engine: the Kimi K3 forward pass over the layers (SPEC §4), and greedy generation.

Placement, expert reads, attention and kernels are plugins; this file only wires the
residual stream (AttnRes), the layer order and the decode state together.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .. import plugin_manager as plugins
from .attnres import Residual, fold
from .budget import DEFAULT_CONTEXT, check_plan, memory_plan
from .checkpoint import PREFIX, check_binding, open_checkpoint
from ..errors import InputError
from .mlp import dense_mlp
from .moe import latent_moe


@dataclass
class DecodeState:
    """What incremental decode carries: each layer's attention state, and the ids consumed."""

    layers: list
    ids: list[int] = field(default_factory=list)

    def copy(self) -> "DecodeState":
        return copy.deepcopy(self)


class Engine:
    """A loaded model. `forward` consumes new ids into a DecodeState and returns logits."""

    def __init__(self, model_dir, *, kernels: str | None = None, threads: int | None = None,
                 expert_store: str | None = None, trunk_placer: str | None = None, attention: dict | None = None,
                 options: dict | None = None, max_context: int = DEFAULT_CONTEXT, available: int | None = None,
                 on_plan: Callable | None = None, pm=None):
        """`options` go to the placer and the store (trunk_dir, trunk_gb, cache_gb, ring_slots, …).
        The memory plan is made, shown to `on_plan` and checked before anything is loaded."""
        self.pm = pm or plugins.get_plugin_manager()
        self.kernels = plugins.choose_kernels(self.pm, kernels)
        if threads is not None:
            self.kernels.set_threads(threads)
        attention = attention or {}
        self.checkpoint = open_checkpoint(model_dir)
        self.config = c = self.checkpoint.config
        self._attention = {kind: plugins.choose_attention(self.pm, kind, attention.get(kind)) for kind in ("kda", "mla")}
        check_binding(self.checkpoint, self.attention_for)
        options = dict(options or {})
        # the default placer follows from whether a packed trunk was given
        placer_cls = plugins.choose_trunk_placer(
            self.pm, trunk_placer or ("pinned" if options.get("trunk_dir") else "resident"))
        store_cls = plugins.choose_expert_store(self.pm, expert_store)
        self.plan = memory_plan(self.checkpoint, placer_cls, store_cls, options, max_context, available)
        if on_plan is not None:
            on_plan(self.plan)
        check_plan(self.plan)
        self.placer = placer_cls(self.checkpoint, c, options)
        self.store = store_cls(self.checkpoint, c, options)
        self.on_route: Callable | None = None   # (layer, expert ids [T, k]) after each routing
        self.on_layer: Callable | None = None   # (layer, layers) as each layer starts: progress for slow tokens
        self.tokens_forwarded = 0

    def attention_for(self, layer: int):
        return self._attention["mla" if self.config.is_mla(layer) else "kda"]

    def new_state(self) -> DecodeState:
        c = self.config
        return DecodeState([self.attention_for(L).new_state(c, L) for L in range(c.num_hidden_layers)])

    def check_ids(self, ids: Sequence[int]) -> None:
        bad = [(i, t) for i, t in enumerate(ids) if not (isinstance(t, (int, np.integer)) and 0 <= t < self.config.vocab_size)]
        if bad:
            shown = ", ".join(f"id {t} at position {i}" for i, t in bad[:5])
            raise InputError(f"token ids must be in 0..{self.config.vocab_size - 1} for this model: {shown}"
                             + (f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""))

    def forward(self, ids: Sequence[int], state: DecodeState, all_logits: bool = False) -> np.ndarray:
        """Consume `ids` after what `state` holds; logits [T, V] if all_logits else [V] (last)."""
        if len(ids) == 0:
            raise InputError("nothing to forward: the id list is empty")
        self.check_ids(ids)
        c, kr = self.config, self.kernels
        stream = Residual(self.placer.embed_rows(ids))
        for L in range(c.num_hidden_layers):
            if self.on_layer is not None:
                self.on_layer(L, c.num_hidden_layers)
            decoder_layer(L, self.placer.layer(L), stream, state.layers[L], c, kr, self.attention_for(L),
                          self.store, self.on_route)
        model = self.placer.model()
        h = stream.mix(kr, fold(model, PREFIX + "output_attn_res"), c.rms_norm_eps)
        if not all_logits:
            h = h[-1:]
        x = kr.rmsnorm(h, model.vec(PREFIX + "norm.weight"), c.rms_norm_eps)
        logits = np.empty((x.shape[0], c.vocab_size), np.float32)
        for row, block in self.placer.head_blocks():
            logits[:, row:row + block.shape[0]] = kr.linear(block, x)
        state.ids.extend(int(t) for t in ids)
        self.tokens_forwarded += len(ids)
        return logits if all_logits else logits[0]

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Teacher forcing: the logits at every position of `ids` from a fresh state, [T, V]."""
        return self.forward(ids, self.new_state(), all_logits=True)

    def generate(self, prompt: Sequence[int], n: int, full_recompute: bool = False):
        """Greedy decode of n ids (the session loop with greedy sampling and no stop ids).
        Incremental unless full_recompute, which runs the whole sequence from scratch for every
        new id. Returns (ids, logits [n, V])."""
        from ..text.sampling import SamplingParams
        from ..text.session import Session

        rows = []
        *_, done = Session(self, None).generate(prompt, SamplingParams(max_tokens=n), on_logits=rows.append,
                                                full_recompute=full_recompute)
        return done.ids, np.array(rows, dtype=np.float32).reshape(n, self.config.vocab_size)

    def stats(self) -> dict:
        return {**self.placer.stats(), **self.store.stats(), "tokens_forwarded": self.tokens_forwarded}

    def close(self):
        self.store.close()
        self.placer.close()
        self.checkpoint.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def decoder_layer(L: int, w, stream: Residual, layer_state, c, kr, attention, store, on_route=None) -> None:
    """One layer (SPEC §4.1): AttnRes in, attention, AttnRes, MLP or latent MoE; updates `stream`."""
    h = stream.mix(kr, fold(w, "self_attention_res"), c.rms_norm_eps) if stream.blocks else stream.prefix
    if L % c.attn_res_block_size == 0:
        stream.close_block()  # the snapshot is the layer's INPUT prefix
    x = kr.rmsnorm(h, w.vec("input_layernorm.weight"), c.rms_norm_eps)
    stream.add(attention.forward(w, x, layer_state, c, kr))
    h = stream.mix(kr, fold(w, "mlp_res"), c.rms_norm_eps)
    x = kr.rmsnorm(h, w.vec("post_attention_layernorm.weight"), c.rms_norm_eps)
    stream.add(dense_mlp(w, x, c, kr) if c.is_dense(L) else latent_moe(w, x, L, c, kr, store, on_route))
