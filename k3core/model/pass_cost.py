"""What a forward pass of T rows costs in weight bytes: the trunk once, and in every MoE layer the experts its
rows route to — their union, which grows with T more slowly than T (consecutive tokens share experts).

`PassCost.of(engine)` reads the byte counts from the checkpoint and learns the union from the engine's own
passes (`on_route`, as an Observer: the mean number of distinct experts per MoE layer for each T seen). Until a
T has been seen, the union is what independent routing would give, E·(1 − (1 − k/E)^T), which is larger than
real routing's (so the first estimates err towards drafting less). `--speculate auto` picks its draft length
from these bytes (generate.py DraftLength); the ids never depend on it.
"""
from __future__ import annotations

import weakref

import numpy as np

from .checkpoint import EXPERT_PARTS, expert_prefix
from .engine import Observer


class PassCost(Observer):
    _known: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def __init__(self, trunk_bytes: float, expert_bytes: float, moe_layers: int, experts: int, per_token: int):
        self.trunk_bytes, self.expert_bytes, self.moe_layers = trunk_bytes, expert_bytes, moe_layers
        self.experts, self.per_token = experts, per_token
        self.unions: dict[int, list[float]] = {}  # rows -> [sum of distinct experts per layer, layers counted]

    @classmethod
    def of(cls, engine) -> "PassCost":
        """The engine's cost model, one per engine (what it learns is kept across generations)."""
        cost = cls._known.get(engine)
        if cost is None:
            cost = cls._known[engine] = cls.of_checkpoint(engine.checkpoint)
        return cost

    @classmethod
    def of_checkpoint(cls, checkpoint) -> "PassCost":
        c = checkpoint.config
        moe_layers = c.num_hidden_layers - min(c.first_k_dense_replace, c.num_hidden_layers)
        if moe_layers == 0:
            return cls(float(sum(checkpoint.index[n].nbytes for n in checkpoint.index.names())), 0.0, 0, 1, 1)
        first = c.first_k_dense_replace
        expert = sum(checkpoint.index[expert_prefix(first, 0) + p].nbytes for p in EXPERT_PARTS)
        total = sum(checkpoint.index[n].nbytes for n in checkpoint.index.names())
        return cls(float(total - moe_layers * c.num_experts * expert), float(expert), moe_layers, c.num_experts,
                   c.num_experts_per_token)

    def on_route(self, layer: int, expert_ids: np.ndarray) -> None:
        seen = self.unions.setdefault(int(expert_ids.shape[0]), [0.0, 0])
        seen[0] += len(np.unique(expert_ids))
        seen[1] += 1

    def union(self, rows: int) -> float:
        """Distinct experts per MoE layer in a pass of `rows` rows: measured, else independent routing's."""
        seen = self.unions.get(rows)
        if seen and seen[1]:
            return seen[0] / seen[1]
        e, k = self.experts, self.per_token
        return min(rows * k, e * (1 - (1 - k / e) ** rows))

    def bytes(self, rows: int) -> float:
        return self.trunk_bytes + self.moe_layers * self.expert_bytes * self.union(rows)
