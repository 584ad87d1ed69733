"""What a draft model runs on: the weights of a draft trunk (io/draft_trunk.py, `k3 pack --draft`), its kernels, its
memory-plan rows and its opening. The draft model itself — the K3 graph of an open engine on these weights with fewer
routed experts per token (issue 40) — is engine.py's DraftModel; the `self` draft source proposes with it. Nothing
here decides a token: its products are the engine kernels' int8_linear / int4_linear (the same bytes on every backend,
thread count and number of rows, docs/NUMERICS.md; not the exact model's, whose weights they approximate), and its
routing takes the top `top_k` of the router's scores instead of the model's num_experts_per_token.

A draft model shares what the engine holds — the checkpoint, the kernels (every product but a draft tensor's), the
attention backends, the expert store (the same MXFP4 experts, fewer of them), the embedding rows (the draft trunk has
none) — and keeps its own decode states and its own draft weights, read once and held in RAM: a draft pays where it is
resident. MLA's kv_b_proj is read per head and transposed (plugins/mla.py), which per-row scales do not survive: it is
held dequantized, as float32.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import UsageError
from ..format.checkpoint import HEAD, layer_prefix
from ..interfaces import Param, PlanRow, TrunkPlacer, Weights
from ..io.draft_trunk import COPIED, KINDS, DraftTensor, DraftTrunk, default_dir, draft_linear, open_draft_trunk
from ..io.trunk import load_trunk
from ..plan.engine_config import EngineConfig, Resolved

DEQUANTIZED = ("self_attn.kv_b_proj.weight",)  # read per head, transposed: held as float32


class DraftKernels:
    """An engine's kernels; a draft tensor's product by the same backend's int8_linear / int4_linear (draft_linear)."""

    def __init__(self, base, kind: str):
        if not getattr(base, "has_draft_kernels", False):
            raise UsageError(f"kernel backend {base.name!r} has no draft kernels (int8_linear, int4_linear), which a "
                             "draft model (--draft-trunk) runs on: pick one of k3's own with --kernels, or leave out "
                             "--draft-trunk")
        self.base, self.name = base, f"{base.name} + draft {kind}"

    def linear(self, w, x: np.ndarray) -> np.ndarray:
        return draft_linear(w, x, self.base) if isinstance(w, DraftTensor) else self.base.linear(w, x)

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


def check_every_layer(draft: DraftTrunk, layers: int) -> None:
    if absent := [L for L in range(layers) if f"layer.{L}" not in draft.runs]:
        raise UsageError(f"the draft trunk in {draft.directory} leaves out {len(absent)} of the model's {layers} "
                         f"layers (the first: {absent[0]}); the draft model runs every layer: derive it without "
                         "--draft-layers")


def held_bytes(draft: DraftTrunk) -> int:
    """What a DraftPlacer holds: every run's bytes as read, and each DEQUANTIZED tensor again as float32."""
    total = sum(r.length for r in draft.runs.values())
    return total + sum(4 * e["shape"][0] * e["shape"][1] for r in draft.runs.values() for e in r.tensors
                       if e["name"] in DEQUANTIZED and e["kind"] != COPIED)


def draft_directory(e: EngineConfig) -> Path:
    """EngineConfig.draft_trunk as a directory: "int8" / "int4" name TRUNK/draft-KIND, anything else is a path."""
    return default_dir(e.trunk, str(e.draft_trunk)) if str(e.draft_trunk) in KINDS else Path(e.draft_trunk)


def draft_topk(e: EngineConfig, most: int) -> int:
    """The draft model's routed experts per token: EngineConfig.draft_topk, else half the model's (at least one)."""
    if e.draft_topk is None:
        return max(1, most // 2)
    if e.draft_topk > most:
        raise UsageError(f"--draft-topk {e.draft_topk} (draft_topk): this model routes each token to {most} experts, "
                         f"so its draft model takes 1..{most}")
    return e.draft_topk


def open_draft(r: Resolved) -> DraftTrunk | None:
    """The draft trunk `r.config` names, checked against the packed trunk it was derived from (nothing read yet), with
    its memory-plan rows given to `r`; None without one."""
    e, c = r.config, r.checkpoint.config
    if e.draft_trunk is None:
        return None
    draft = open_draft_trunk(draft_directory(e), load_trunk(e.trunk, r.checkpoint))
    check_every_layer(draft, c.num_hidden_layers)
    top_k = draft_topk(e, c.num_experts_per_token)
    r.more_rows = lambda config: plan_rows(draft, r, config, top_k)
    return draft


def plan_rows(draft: DraftTrunk, r: Resolved, e: EngineConfig, top_k: int) -> list[PlanRow]:
    """The draft model's weights, and a decode state of it per sequence (`max_context` positions, and the rollback of
    `speculate` drafted ids: it marks, then forwards the last id and its drafts)."""
    c = r.checkpoint.config
    layers = range(c.num_hidden_layers)
    state = sum(r.attention_for(L).state_bytes(c, L, e.max_context) for L in layers)
    rollback = sum(r.attention_for(L).rollback_bytes(c, L, e.speculate) for L in layers) if e.speculate else 0
    each = f", x {e.sequences} sequences" if e.sequences > 1 else ""
    return [PlanRow("draft trunk", held_bytes(draft), f"{draft.spec.kind} draft of {len(layers)} layers "
                    f"({draft.directory}), held; {top_k} of {c.num_experts_per_token} routed experts per token "
                    "(--draft-topk)" + (", only those the expert cache holds (--draft-cache-only)"
                                        if e.draft_cache_only else "")),
            PlanRow("draft decode state", (state + rollback) * e.sequences,
                    f"the draft model's, {e.max_context} positions and the rollback of {e.speculate} drafted ids"
                    + each)]


class DraftPlacer:
    """Where the draft model's weights come from: every layer and the head from the draft trunk, read once at open
    (each run checked against its checksums); the embedding rows from the engine's own placer, `target`. `layers`:
    the model's number of layers, every one of which the draft trunk must hold."""

    def __init__(self, target: TrunkPlacer, draft: DraftTrunk, layers: int):
        check_every_layer(draft, layers)
        self.target, self.kind = target, draft.spec.kind
        self._layers = [Weights(layer_prefix(L), held(draft.layer(L))) for L in range(layers)]
        model = held(draft.model())
        self._head = model.pop(HEAD)
        self._model = Weights("", model)
        self.held = held_bytes(draft)

    def layer(self, layer: int) -> Weights:
        return self._layers[layer]

    def model(self) -> Weights:
        return self._model

    def embed_rows(self, ids):
        return self.target.embed_rows(ids)

    def head_blocks(self):
        yield 0, self._head

    def stats(self) -> dict:
        """Nothing is read after open: no counters."""
        return {}

    def close(self) -> None:
        """The embedding belongs to the engine's placer: nothing of the draft's own to release."""
