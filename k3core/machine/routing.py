"""The real model's routing, read from a recorded trace: how many distinct experts T consecutive tokens route to
in a MoE layer, against one token's top-k. A verify pass of T rows reads that union, not T × top-k experts.

A trace is little-endian int32 (layer, expert) pairs, the k3-in-c format (`k3 run --dump-trace` writes it too):
forward after forward, each visiting its MoE layers in order and giving, per layer, top-k experts for each of
its positions in turn. The C engine's trace (tests/fixtures/k3-in-c/expert_trace.bin) is 8 full-recompute
forwards of 5 to 12 positions, so its last forward holds every position.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import InputError


def last_forward(path, top_k: int = 16) -> np.ndarray:
    """The experts of the trace's last forward, [MoE layers, positions, top_k] (a forward ends where the layer
    number falls back)."""
    path = Path(path)
    if not path.is_file() or not path.stat().st_size or path.stat().st_size % 8:
        raise InputError(f"{path}: not a routing trace (a whole, non-zero number of 8-byte (layer, expert) pairs)")
    pairs = np.fromfile(path, dtype="<i4").reshape(-1, 2)
    starts = np.flatnonzero(np.diff(pairs[:, 0]) < 0) + 1
    forward = pairs[starts[-1] if starts.size else 0:]
    layers = np.unique(forward[:, 0])
    if len(forward) % (len(layers) * top_k):
        raise InputError(f"{path}: its last forward's {len(forward)} pairs are not {len(layers)} layers × "
                         f"top-{top_k} × whole positions")
    experts = forward[:, 1].reshape(len(layers), -1, top_k)
    if not (forward[:, 0].reshape(len(layers), -1) == layers[:, None]).all():
        raise InputError(f"{path}: its last forward does not visit its layers one after another")
    return experts


def union_ratios(experts: np.ndarray) -> list[float]:
    """Item T − 1: the distinct experts of T consecutive positions in a layer ÷ one position's, averaged over every
    window of T positions in every layer (T = 1 .. the positions there are)."""
    layers, positions, top_k = experts.shape
    return [float(np.mean([len(np.unique(experts[layer, start:start + t])) for layer in range(layers)
                           for start in range(positions - t + 1)])) / top_k for t in range(1, positions + 1)]
