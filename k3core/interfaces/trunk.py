"""The trunk placer kind: which trunk (non-expert) tensors stay in RAM and how the others arrive."""
from __future__ import annotations

from abc import abstractmethod
from typing import Iterable, Sequence

import numpy as np

from .base import ContextPlugin, PluginContext
from .tensors import Param, Weights


class TrunkPlacer(ContextPlugin):
    """Which trunk (non-expert) tensors stay in RAM and how the others arrive.

    Call order: `plan(ctx)`, `__init__(ctx)`, then per forward pass `embed_rows`, `layer(L)` for
    L = 0, 1, … in order, `model()`, `head_blocks()`; `stats()` any time; `close()` once. What
    `layer` and `head_blocks` hand out stays valid until the next such call. The engine scans the F32/F16
    tensors of each Weights object `layer` and `model` return for NaN and infinity when it first sees that
    object: return the same object again only while its values are unchanged (a pinned layer), and values
    read anew (a streamed layer) in a new object. `stats()` counts under the names in PLACER_STATS (plugin_api)."""

    @classmethod
    def streamed_bytes(cls, ctx: PluginContext) -> int:
        """Trunk bytes one forward pass reads from disk under this plan (as stored); the prefill chunk `auto`
        picks weighs them (plan/prefill.py). The default, 0, says every trunk tensor stays in RAM."""
        return 0

    @abstractmethod
    def layer(self, layer: int) -> Weights:
        """The trunk tensors of one layer, names relative to `layers.{layer}.`."""

    @abstractmethod
    def model(self) -> Weights:
        """The small model-level tensors (final norm, output AttnRes), full names."""

    @abstractmethod
    def embed_rows(self, ids: Sequence[int]) -> np.ndarray:
        """Rows `ids` of the embedding, float32 [T, H] (gathered, never multiplied)."""

    @abstractmethod
    def head_blocks(self) -> Iterable[tuple[int, Param]]:
        """lm_head as (first row, Param of consecutive rows) blocks in row order. Rows are
        independent, so blocking never changes a bit."""
