"""Non-finite weights named where they enter a forward pass: a NaN or an infinity in the checkpoint is a
CheckpointError (exit 2) naming the tensor, raised before any token it would change is produced.

Small float tensors (F32/F16: norms, A_log, dt_bias, conv weights, biases) are checked whenever the engine
takes Weights it has not checked — a pinned layer once, a streamed one on every read — and embedding rows as
they are gathered. BF16 matrices are too large to scan per read: `output_error` names the first that holds a
NaN or an infinity once a layer's output is not finite, and `head_error` the lm_head rows whose logits are not.
E8M0 scale bytes of 255 are not non-finite (MODEL.md §5).
"""
from __future__ import annotations

import weakref
from typing import Sequence

import numpy as np

from ..errors import CheckpointError, K3Error
from ..interfaces import Param, Weights
from ..format.checkpoint import EMBED, FLOAT, HEAD, MATRIX

SMALL = tuple(d for d in FLOAT if d not in MATRIX)  # F16, F32: dtypes only small tensors may have
SHOWN_IDS = 8
DAMAGED = "the checkpoint is damaged (`k3 verify --deep` lists every such tensor)"


def describe(values: np.ndarray) -> str:
    """How many of `values` are not finite, and which: "2 non-finite value(s) (1 NaN, 1 +inf)"."""
    counts = {kind: int(np.count_nonzero(hit)) for kind, hit in
              (("NaN", np.isnan(values)), ("+inf", np.isposinf(values)), ("-inf", np.isneginf(values)))}
    return f"{sum(counts.values())} non-finite value(s) ({', '.join(f'{n} {k}' for k, n in counts.items() if n)})"


def _values(param) -> np.ndarray:
    """A small tensor's values, flat (F16 bits may come as uint16: Param)."""
    return (param.data if param.dtype == "F32" else param.data.view(np.float16)).reshape(-1)


def check_small(w: Weights, layer: int | None) -> None:
    """Every small float tensor of `w` (of layer `layer`, or None for the model level) finite, else a
    CheckpointError naming the first that is not and counting its bad values."""
    small = {name: _values(param) for name, param in w.items() if param.dtype in SMALL}
    if not small or np.isfinite(np.concatenate(list(small.values()))).all():  # one scan, not one per tensor
        return
    name = next(name for name, values in small.items() if not np.isfinite(values).all())
    owner = name if layer is None else f"layer {layer}'s {name}"
    raise CheckpointError(f"{owner} holds {describe(small[name])}: {DAMAGED}", tensor=w.prefix + name)


class BindCheck:
    """The engine's check of the Weights a placer hands out. One already checked is held weakly under its key
    (a layer, or "model"): handed out again (a pinned layer) it is not scanned again; read anew (a streamed
    layer) it is a new object and is. So a placer hands out the same object only while its values are the same."""

    def __init__(self):
        self._checked: dict[int | str, weakref.ref] = {}

    def layer(self, layer: int, w: Weights) -> Weights:
        return self._bind(layer, w, layer)

    def model(self, w: Weights) -> Weights:
        return self._bind("model", w, None)

    def _bind(self, key: int | str, w: Weights, layer: int | None) -> Weights:
        seen = self._checked.get(key)
        if seen is None or seen() is not w:
            check_small(w, layer)
            self._checked[key] = weakref.ref(w)
        return w


def check_embed_rows(rows: np.ndarray, ids: Sequence[int]) -> None:
    """Every value of `rows` (float32 [T, H], the embedding rows of `ids`) finite, else a CheckpointError naming
    the embedding and the token ids whose rows are not."""
    if np.isfinite(rows).all():
        return
    finite = np.isfinite(rows).all(axis=1)
    bad = {int(t): row for t, row, ok in zip(ids, rows, finite) if not ok}  # one row per distinct id
    tokens = sorted(bad)
    shown = ", ".join(map(str, tokens[:SHOWN_IDS])) + (f" and {len(tokens) - SHOWN_IDS} more"
                                                       if len(tokens) > SHOWN_IDS else "")
    raise CheckpointError(f"the embedding rows of token id(s) {shown} hold "
                          f"{describe(np.concatenate([bad[t] for t in tokens]))}: {DAMAGED}", tensor=EMBED)


def head_error(first_row: int, block, logits: np.ndarray) -> K3Error:
    """Logits of lm_head's rows from `first_row` (`block`, a Param, gave `logits` [T, rows]) are not finite though
    the final hidden state is: the rows that hold a NaN or an infinity (a damaged checkpoint, exit 2), or an
    overflow (exit 1)."""
    bad = np.flatnonzero(~np.isfinite(logits).all(axis=0))  # rows of the block whose logits are not finite
    values = Param(block.data[bad], block.dtype).f32()
    if (rows := bad[~np.isfinite(values).all(axis=1)]).size:
        ids = ", ".join(str(first_row + int(r)) for r in rows[:SHOWN_IDS]) + (" …" if rows.size > SHOWN_IDS else "")
        return CheckpointError(f"lm_head's rows for token id(s) {ids} hold {describe(values)}: {DAMAGED}", tensor=HEAD)
    return K3Error("the logits are not finite, though the final hidden state and lm_head are: the activations "
                   "overflowed; the ids would be noise, so the run stops")


def output_error(layer: int, w: Weights) -> K3Error:
    """Layer `layer`'s output is not finite though its input was: the first of its BF16 tensors (F32 and F16 ones
    were checked when bound) that holds a NaN or an infinity (a damaged checkpoint, exit 2) — or, if none does,
    the activations overflowed (exit 1)."""
    for name, param in w.items():
        if param.dtype in MATRIX and not np.isfinite(values := param.f32()).all():
            return CheckpointError(f"layer {layer}'s output is not finite: {name} holds {describe(values)}: {DAMAGED}",
                                   tensor=w.prefix + name)
    return K3Error(f"layer {layer}'s output is not finite, though its input and its trunk weights are: the "
                   "activations overflowed (or a routed expert's values are out of range); the ids would be noise, "
                   "so the run stops")
