"""Attention Residuals (MODEL.md §4.1): the residual stream as attention over depth.

A layer's input is not a running sum but a softmax-weighted mix of block snapshots and the
current partial sum; this module holds that bookkeeping for one forward pass.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..interfaces import KernelBackend, Weights


def fold(w: Weights, name: str) -> np.ndarray:
    """w_norm ⊙ w_proj as one float64 vector (`name` is e.g. "mlp_res")."""
    return w.vec(f"{name}_norm.weight").astype(np.float64) * w.vec(f"{name}_proj.weight").reshape(-1)


class Residual:
    """The stream of one forward pass: `blocks` (snapshots) and `prefix` (sum since the last one)."""

    def __init__(self, h: np.ndarray) -> None:
        self.blocks: list[np.ndarray] = []
        self.prefix: np.ndarray | None = h

    def mix(self, kr: KernelBackend, fold_vector: np.ndarray, eps: float) -> np.ndarray:
        """AttnRes over blocks + [prefix]: values are the RAW sources."""
        return kr.attnres(self.blocks + [self.prefix], fold_vector, eps)

    def close_block(self) -> None:
        self.blocks.append(self.prefix)
        self.prefix = None

    def add(self, x: np.ndarray) -> None:
        self.prefix = x if self.prefix is None else self.prefix + x

    def plain_sum(self) -> np.ndarray:
        """The stream as a plain residual sum: every block snapshot, then the partial sum, added in order (float32);
        what a hidden state is to a reader that knows no attention residuals (a draft head)."""
        parts = self.blocks + ([self.prefix] if self.prefix is not None else [])
        out = parts[0].copy()
        for part in parts[1:]:
            out += part
        return out
