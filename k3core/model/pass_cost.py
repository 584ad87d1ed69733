"""What a forward pass of T rows costs: the weight bytes it touches and the bytes it reads from disk.

A pass touches the trunk once and, in every MoE layer, the experts its rows route to: their union, which grows
with T more slowly than T (consecutive tokens share experts). What it reads is what of that is not held in RAM:
the trunk layers that are not pinned, and the experts the cache misses. `PassCost.of(engine)` takes the byte
counts from the checkpoint and learns the rest from the engine's own passes, as an Observer: the mean number of
distinct experts per MoE layer for each T seen, the trunk bytes a pass reads, and the bytes read per expert
routed. Until a T has been seen its union is independent routing's, E·(1 − (1 − k/E)^T), larger than real
routing's (so first estimates err towards drafting less).

cost(T) = touched(T) + READ_WEIGHT × read(T): a byte from disk counts as READ_WEIGHT bytes from RAM (NVMe at
2-7 GB/s against RAM at tens of GB/s). `--speculate auto` picks its draft length from these costs
(generate.py DraftLength); the ids never depend on them.
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..format.checkpoint import expert_bytes, trunk_bytes_per_pass
from .engine import Engine
from .observer import Observer

if TYPE_CHECKING:
    from ..format.checkpoint import Checkpoint

READ_WEIGHT = 4.0  # a byte read from disk, in bytes touched in RAM


class PassCost(Observer):
    _known: "weakref.WeakKeyDictionary[Engine, PassCost]" = weakref.WeakKeyDictionary()

    def __init__(self, trunk_bytes: float, expert_bytes: float, moe_layers: int, experts: int, per_token: int,
                 stats: Callable[[], dict] | None = None) -> None:
        self.trunk_bytes, self.expert_bytes, self.moe_layers = trunk_bytes, expert_bytes, moe_layers
        self.experts, self.per_token = experts, per_token
        self.stats = stats  # () -> the engine's cumulative stats, or None: nothing read is known
        self.unions: dict[int, list[float]] = {}  # rows -> [sum of distinct experts per layer, layers counted]
        self.trunk_read = [0.0, 0]                # [trunk bytes read, passes]
        self.expert_read = [0.0, 0]               # [expert bytes read, experts routed]
        self._open: list[Any] | None = None       # the pass under way: [rows, experts routed, stats before]

    @classmethod
    def of(cls, engine: Engine) -> "PassCost":
        """The engine's cost model, one per engine (what it learns is kept across generations)."""
        cost = cls._known.get(engine)
        if cost is None:
            cost = cls._known[engine] = cls.of_checkpoint(engine.checkpoint, engine.stats)
        return cost

    @classmethod
    def of_checkpoint(cls, checkpoint: Checkpoint, stats: Callable[[], dict] | None = None) -> "PassCost":
        c = checkpoint.config
        return cls(float(trunk_bytes_per_pass(checkpoint)), float(expert_bytes(checkpoint)), c.moe_layers,
                   c.num_experts, c.num_experts_per_token, stats)

    # ---- learning, as an Observer ---------------------------------------------------------------------------
    def on_layer(self, layer: int, layers: int) -> None:
        if layer == 0:
            self._close()
            if self.stats is not None:
                self._open = [0, 0, self._read_so_far()]

    def on_route(self, layer: int, expert_ids: np.ndarray) -> None:
        rows, distinct = int(expert_ids.shape[0]), len(np.unique(expert_ids))
        seen = self.unions.setdefault(rows, [0.0, 0])
        seen[0] += distinct
        seen[1] += 1
        if self._open is not None:
            self._open[0] = rows
            self._open[1] += distinct

    def on_token(self, token: int, logits: np.ndarray) -> None:
        self._close()  # the pass's reads are done; a draft source's, before the next pass, are not its

    def _read_so_far(self) -> tuple[int, int]:
        s = self.stats()
        return s.get("trunk_bytes_read", 0), s.get("expert_bytes_read", 0)

    def _close(self) -> None:
        """Book the pass that ended: what it read of the trunk, and of the experts per expert it routed."""
        if self._open is None:
            return
        _, routed, (trunk_before, experts_before) = self._open
        trunk_now, experts_now = self._read_so_far()
        self.trunk_read[0] += trunk_now - trunk_before
        self.trunk_read[1] += 1
        self.expert_read[0] += experts_now - experts_before
        self.expert_read[1] += routed
        self._open = None

    # ---- the estimates --------------------------------------------------------------------------------------
    def union(self, rows: int) -> float:
        """Distinct experts per MoE layer in a pass of `rows` rows: measured, else independent routing's."""
        seen = self.unions.get(rows)
        if seen and seen[1]:
            return seen[0] / seen[1]
        e, k = self.experts, self.per_token
        return min(rows * k, e * (1 - (1 - k / e) ** rows))

    def touched(self, rows: int) -> float:
        return self.trunk_bytes + self.moe_layers * self.expert_bytes * self.union(rows)

    def read(self, rows: int) -> float:
        """Disk bytes of a pass of `rows` rows, as this engine's passes so far read them (0 before any)."""
        trunk = self.trunk_read[0] / self.trunk_read[1] if self.trunk_read[1] else 0.0
        per_expert = self.expert_read[0] / self.expert_read[1] if self.expert_read[1] else 0.0
        return trunk + per_expert * self.moe_layers * self.union(rows)

    def bytes(self, rows: int) -> float:
        return self.touched(rows) + READ_WEIGHT * self.read(rows)
