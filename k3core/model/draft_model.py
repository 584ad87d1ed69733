"""A draft model: the K3 graph of an open engine run on a draft trunk (io/draft_trunk.py, `k3 pack --draft`) with
fewer routed experts per token (issue 40). What proposes ids for the exact model to verify, so nothing here decides
a token: its products are draft_linear's (deterministic, not bit-identical to the exact kernels), and its routing
takes the top `top_k` of the router's scores instead of the model's num_experts_per_token.

It shares what the engine holds — the checkpoint, the kernels (every product but a draft tensor's), the attention
backends, the expert store (the same MXFP4 experts, fewer of them), the embedding rows (the draft trunk has none) —
and keeps its own decode states and its own draft weights, read once and held in RAM: a draft pays where it is
resident. MLA's kv_b_proj is read per head and transposed (plugins/mla.py), which per-row scales do not survive:
it is held dequantized, as float32.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..errors import UsageError
from ..format.checkpoint import HEAD, layer_prefix
from ..interfaces import Param, Weights
from ..io.draft_trunk import COPIED, DraftTensor, DraftTrunk, draft_linear
from .engine import Engine
from .finite import BindCheck

DEQUANTIZED = ("self_attn.kv_b_proj.weight",)  # read per head, transposed: held as float32


class DraftKernels:
    """An engine's kernels, a draft tensor's product by draft_linear."""

    def __init__(self, base, kind: str):
        self.base, self.name = base, f"{base.name} + draft {kind}"

    def linear(self, w, x: np.ndarray) -> np.ndarray:
        return draft_linear(w, x) if isinstance(w, DraftTensor) else self.base.linear(w, x)

    def __getattr__(self, name: str):
        return getattr(self.base, name)


def held(tensors: dict[str, DraftTensor]) -> dict:
    """A run's draft tensors as the blocks read them: copied ones as Params, DEQUANTIZED ones as float32 Params,
    the other quantized ones as they are (DraftKernels.linear takes them)."""
    out = {}
    for name, t in tensors.items():
        if t.kind == COPIED:
            out[name] = Param(t.data, t.dtype, name)
        elif name in DEQUANTIZED:
            out[name] = Param(np.ascontiguousarray(t.dequantized()), "F32", name)
        else:
            out[name] = t
    return out


class DraftPlacer:
    """Where the draft model's weights come from: every layer and the head from the draft trunk, read once at open
    (each run checked against its checksums); the embedding rows from the engine's own placer."""

    def __init__(self, target: Engine, draft: DraftTrunk):
        n = target.config.num_hidden_layers
        if absent := [L for L in range(n) if f"layer.{L}" not in draft.runs]:
            raise UsageError(f"the draft trunk in {draft.directory} leaves out {len(absent)} of the model's {n} layers "
                             f"(the first: {absent[0]}); the draft model runs every layer: derive it without "
                             "--draft-layers")
        self.target, self.kind = target.placer, draft.spec.kind
        self._layers = [Weights(layer_prefix(L), held(draft.layer(L))) for L in range(n)]
        model = held(draft.model())
        self._head = model.pop(HEAD)
        self._model = Weights("", model)

    def layer(self, layer: int) -> Weights:
        return self._layers[layer]

    def model(self) -> Weights:
        return self._model

    def embed_rows(self, ids):
        return self.target.embed_rows(ids)

    def head_blocks(self):
        yield 0, self._head

    def close(self) -> None:
        """The embedding belongs to the engine's placer: nothing of the draft's own to release."""


class DraftModel(Engine):
    """`target`'s graph on the draft weights `placer` holds with `top_k` routed experts per token: new_state, forward,
    logits, mark and rollback as the engine's (model/engine.py), each state the draft model's own. Draft models of
    one placer share its weights (read once)."""

    def __init__(self, target: Engine, placer: DraftPlacer, top_k: int):
        most = target.config.num_experts_per_token
        if not (isinstance(top_k, int) and 1 <= top_k <= most):
            raise UsageError(f"the draft's routed experts per token must be an integer in 1..{most} (the model "
                             f"routes each token to {most}), got {top_k!r}")
        self.checkpoint, self.store, self._attention = target.checkpoint, target.store, target._attention
        self.config = replace(target.config, num_experts_per_token=top_k)
        self.kernels, self.placer = DraftKernels(target.kernels, placer.kind), placer
        self.max_context, self.prefill_chunk = target.max_context, target.prefill_chunk
        self.sequences, self.speculate = 1, target.speculate
        self.tokens_forwarded = self.forward_passes = 0
        self._bound, self._snapshots = BindCheck(), {}

    def close(self) -> None:
        """The checkpoint, the store and the embedding are the engine's: it closes them."""
