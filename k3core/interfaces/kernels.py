"""The kernel backend kind: the numeric kernels, every one following docs/NUMERICS.md's accumulation order, and
the thread counts they split rows over."""
from __future__ import annotations

import os
from abc import abstractmethod
from typing import ClassVar, Sequence

import numpy as np

from .base import Plugin
from .tensors import ExpertWeights, Param


def default_threads() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# The kernel families whose threads KernelBackend.set_family_threads caps: dense (linear, int8_linear, int4_linear),
# experts (mxfp4_linear, expert), attention (kda_recurrence, mqa_attention, short_conv, kda_decay), other (the rest).
KERNEL_FAMILIES = ("dense", "experts", "attention", "other")


class KernelBackend(Plugin):
    """The numeric kernels. Every backend follows docs/NUMERICS.md's accumulation order."""

    # True: every kernel gives the scalar backend's bits (the native backends, and any plugin).
    # False only for the numpy `reference`, whose exp/tanh are numpy's: bit-identical where none is used.
    bit_exact: ClassVar[bool] = True

    def available(self) -> bool:
        return True

    def set_threads(self, threads: int) -> None:
        """Threads split independent output rows only; the default ignores the request."""

    def set_family_threads(self, family: str, threads: int) -> None:
        """At most `threads` threads for the kernels of a KERNEL_FAMILIES family (0: no cap); the default ignores it."""

    @abstractmethod
    def linear(self, w: Param, x: np.ndarray) -> np.ndarray:
        """y[t, o] = sum_i w[o, i] x[t, i] for a BF16/F16/F32 weight [O, I]; x [T, I]."""

    @abstractmethod
    def mxfp4_linear(self, packed: np.ndarray, scale: np.ndarray, x: np.ndarray) -> np.ndarray:
        """The same product from MXFP4 bytes, never a dequantised copy of the weight."""

    has_draft_kernels: ClassVar[bool] = False  # it implements int8_linear and int4_linear (a draft model needs them)

    def int8_linear(self, codes: np.ndarray, scales: np.ndarray, x: np.ndarray) -> np.ndarray:
        """A draft trunk's int8 rows (io/draft_trunk.py): codes int8 [O, I], scales float32 [O], x [T, I] →
        float32 [T, O] = f32(scales[o] · lane_dot(codes[o], x[t])), the scale applied once to the row's sum.
        Optional: only a draft model (--draft-trunk) calls it; a backend that has both sets has_draft_kernels."""
        raise NotImplementedError(f"kernel backend {self.name!r} has no int8_linear, which a draft model needs")

    def int4_linear(self, packed: np.ndarray, scales: np.ndarray, cols: int, x: np.ndarray) -> np.ndarray:
        """A draft trunk's int4 groups of 32 columns: packed uint8 [O, G·16] (column 2k the LOW nibble of byte k,
        code = nibble − 8), scales float32 [O, G], G = ceil(cols / 32), x [T, cols] → float32 [T, O] =
        f32(lane_dot(code · scale, x[t])); the last group's padding is never read. Optional, as int8_linear."""
        raise NotImplementedError(f"kernel backend {self.name!r} has no int4_linear, which a draft model needs")

    @abstractmethod
    def expert(self, e: ExpertWeights, z: np.ndarray, beta: float, linear_beta: float) -> np.ndarray:
        """w2 · SiTU-GLU(w1 z, w3 z) for z [T, latent]."""

    @abstractmethod
    def rmsnorm(self, x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
        """Row-wise w ⊙ x / sqrt(mean(x²) + eps); w None means no gain."""

    @abstractmethod
    def l2norm_heads(self, x: np.ndarray, heads: int, eps: float) -> np.ndarray:
        """x [T, heads·D]: each head's D values / sqrt(sum(x²) + eps)."""

    @abstractmethod
    def situ_glu(self, g: np.ndarray, u: np.ndarray, beta: float, linear_beta: float) -> np.ndarray:
        """β·tanh(g/β)·σ(g) · λ·tanh(u/λ), elementwise."""

    @abstractmethod
    def sigmoid(self, x: np.ndarray) -> np.ndarray:
        """σ(x), elementwise."""

    @abstractmethod
    def mul_sigmoid(self, y: np.ndarray, g: np.ndarray) -> np.ndarray:
        """y ⊙ σ(g), elementwise (output gates)."""

    @abstractmethod
    def short_conv(self, x: np.ndarray, history: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Causal depthwise conv + SiLU. x [T, C], history [K-1, C] oldest first, w [C, K].

        Returns (y [T, C], new history [K-1, C])."""

    @abstractmethod
    def kda_decay(self, z: np.ndarray, a_log: np.ndarray, dt_bias: np.ndarray, lower_bound: float) -> np.ndarray:
        """α = exp(lower_bound · σ(exp(A_log[h]) · (z + dt_bias))); z [T, heads, D]."""

    @abstractmethod
    def kda_recurrence(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, alpha: np.ndarray, beta: np.ndarray,
                       state: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
        """The delta-rule recurrence over T steps; q,k,v,alpha [T, heads, D], beta [T, heads],
        state [heads, D, D]. Returns (o [T, heads, D], new state); `state` itself is left unchanged."""

    @abstractmethod
    def mqa_attention(self, q: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float) -> np.ndarray:
        """One query position: q [heads, dk] over keys [n, dk], values [n, dv] shared by all
        heads; softmax(q·k · scale) · v → [heads, dv]."""

    @abstractmethod
    def router(self, logits: np.ndarray, bias: np.ndarray, top_k: int, renormalize: bool,
               scaling: float) -> tuple[np.ndarray, np.ndarray]:
        """Sigmoid scores; top-k by score + bias (ties: lowest index); weights from the
        unbiased scores. Returns (ids int64 [T, k] in rank order, weights float32 [T, k])."""

    @abstractmethod
    def combine(self, outputs: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
        """Σ_j weights[j] · outputs[j], summed in the order given."""

    @abstractmethod
    def attnres(self, sources: Sequence[np.ndarray], fold: np.ndarray, eps: float) -> np.ndarray:
        """Attention over depth: softmax over sources of RMSNorm(s)·fold, applied to the raw sources."""


def kernel_names() -> tuple[str, ...]:
    """The kernels every KernelBackend provides: its public methods, less the three that set it up."""
    setup = ("available", "set_threads", "set_family_threads")
    return tuple(sorted(n for n, f in vars(KernelBackend).items()
                        if callable(f) and not n.startswith("_") and n not in setup))
