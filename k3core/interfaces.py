"""The small typed interfaces a plugin implements or receives: one per replaceable kind.

Plugins see these and the hook specs (k3core.hookspecs), nothing else of the engine.
Arrays are numpy; activations crossing an interface are float32 and C-contiguous.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from .errors import CheckpointError


@dataclass(frozen=True)
class TensorSpec:
    """A tensor the config implies: its name, shape and the dtypes it may be stored in.

    `shape` None means any shape holding at least `min_numel` values (A_log is padded)."""

    name: str
    shape: tuple[int, ...] | None
    dtypes: tuple[str, ...]
    min_numel: int = 0


class Param:
    """One tensor as stored: the raw array (BF16 as uint16 bits) and its safetensors dtype."""

    __slots__ = ("data", "dtype", "name")

    def __init__(self, data: np.ndarray, dtype: str, name: str = ""):
        self.data, self.dtype, self.name = data, dtype, name

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    def f32(self) -> np.ndarray:
        """The values widened to float32 (exact for BF16 and F16)."""
        if self.dtype == "BF16":
            return (self.data.astype(np.uint32) << 16).view(np.float32)
        return self.data.astype(np.float32)


class Weights(Mapping[str, Param]):
    """A layer's (or the model's) trunk tensors by name relative to their prefix."""

    def __init__(self, prefix: str, params: Mapping[str, Param]):
        self.prefix, self._params = prefix, dict(params)

    def __getitem__(self, name: str) -> Param:
        try:
            return self._params[name]
        except KeyError:
            raise CheckpointError("tensor not loaded for this layer", tensor=self.prefix + name) from None

    def __iter__(self):
        return iter(self._params)

    def __len__(self):
        return len(self._params)

    def vec(self, name: str) -> np.ndarray:
        """A small tensor widened to float32 (SPEC §3: widen small vectors at load)."""
        return self[name].f32()

    @property
    def nbytes(self) -> int:
        return sum(p.data.nbytes for p in self._params.values())


@dataclass(frozen=True)
class ExpertWeights:
    """One routed expert in MXFP4: packed nibbles [rows, in/2] and E8M0 scales [rows, in/32]."""

    layer: int
    expert: int
    w1_packed: np.ndarray
    w1_scale: np.ndarray
    w2_packed: np.ndarray
    w2_scale: np.ndarray
    w3_packed: np.ndarray
    w3_scale: np.ndarray


class KernelBackend(ABC):
    """The numeric kernels. Every backend follows docs/NUMERICS.md's accumulation order."""

    name: ClassVar[str]
    description: ClassVar[str] = ""

    def available(self) -> bool:
        return True

    def set_threads(self, threads: int) -> None:
        """Threads split independent output rows only; the default ignores the request."""

    @abstractmethod
    def linear(self, w: Param, x: np.ndarray) -> np.ndarray:
        """y[t, o] = sum_i w[o, i] x[t, i] for a BF16/F16/F32 weight [O, I]; x [T, I]."""

    @abstractmethod
    def mxfp4_linear(self, packed: np.ndarray, scale: np.ndarray, x: np.ndarray) -> np.ndarray:
        """The same product from MXFP4 bytes, never a dequantised copy of the weight."""

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
    def kda_recurrence(self, q, k, v, alpha, beta, state, scale) -> tuple[np.ndarray, np.ndarray]:
        """The delta-rule recurrence over T steps; q,k,v,alpha [T, heads, D], beta [T, heads],
        state [heads, D, D]. Returns (o [T, heads, D], new state)."""

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


class AttentionBackend(ABC):
    """One attention kind ("kda" or "mla") for one or more layers."""

    kind: ClassVar[str]
    name: ClassVar[str]

    @abstractmethod
    def tensor_specs(self, config, layer: int) -> list[TensorSpec]:
        """Tensors this backend reads, named relative to `layers.{layer}.`."""

    @abstractmethod
    def new_state(self, config, layer: int) -> Any:
        """The empty decode state of a layer (it must support copy.deepcopy)."""

    @abstractmethod
    def forward(self, w: Weights, x: np.ndarray, state: Any, config, kernels: KernelBackend) -> np.ndarray:
        """Consume T new tokens x [T, H] (already input_layernorm-ed), advancing `state`."""

    def state_arrays(self, state: Any) -> dict[str, np.ndarray]:
        """The state as named arrays, for state files (chat /save)."""
        raise NotImplementedError(f"attention backend {self.name!r} cannot save its decode state")

    def state_from_arrays(self, config, layer: int, arrays: Mapping[str, np.ndarray]) -> Any:
        """The inverse of state_arrays."""
        raise NotImplementedError(f"attention backend {self.name!r} cannot load a decode state")


class CachePolicy(ABC):
    """Which experts a store keeps, as a pure decision rule over (layer, expert) keys, so that
    `k3 sim-cache` can replay a recorded trace through it without reading anything."""

    def __init__(self, slots: int):
        self.slots = slots

    @abstractmethod
    def access(self, key: tuple[int, int]) -> bool:
        """Record one request; True if `key` was resident before it (a TRUE hit)."""


class ExpertStore(ABC):
    """Where routed experts come from: read on demand, cached, or otherwise."""

    name: ClassVar[str]
    description: ClassVar[str] = ""

    @classmethod
    def cache_policy(cls, slots: int) -> CachePolicy | None:
        """The store's retention rule for `slots` expert slots; None for a store that keeps nothing."""
        return None

    def __init__(self, checkpoint, config, options: Mapping[str, Any]):
        self.checkpoint, self.config, self.options = checkpoint, config, dict(options)

    @classmethod
    def plan(cls, checkpoint, config, options: Mapping[str, Any]) -> list[tuple[str, int, str]]:
        """What this store would hold in RAM: (item, bytes, detail) rows for the memory plan."""
        return []

    def capacity(self) -> int:
        """How many experts one fetch may ask for (at least the router's top-k)."""
        return self.config.num_experts_per_token

    @abstractmethod
    def fetch(self, layer: int, experts: Sequence[int]) -> list[ExpertWeights]:
        """The distinct experts of `layer`, in the order asked; valid until the next fetch. A failed
        read raises, never returns junk."""

    def stats(self) -> dict:
        return {}

    def close(self) -> None:
        """Release files and buffers."""


class TrunkPlacer(ABC):
    """Which trunk (non-expert) tensors stay in RAM and how the others arrive."""

    name: ClassVar[str]
    description: ClassVar[str] = ""

    def __init__(self, checkpoint, config, options: Mapping[str, Any]):
        self.checkpoint, self.config, self.options = checkpoint, config, dict(options)

    @classmethod
    def plan(cls, checkpoint, config, options: Mapping[str, Any]) -> list[tuple[str, int, str]]:
        """What this placer would hold in RAM: (item, bytes, detail) rows for the memory plan."""
        return []

    @abstractmethod
    def layer(self, layer: int) -> Weights:
        """The trunk tensors of one layer, names relative to `layers.{layer}.`; valid until the
        next call."""

    @abstractmethod
    def model(self) -> Weights:
        """The small model-level tensors (final norm, output AttnRes), full names."""

    @abstractmethod
    def embed_rows(self, ids: Sequence[int]) -> np.ndarray:
        """Rows `ids` of the embedding, float32 [T, H] (gathered, never multiplied)."""

    @abstractmethod
    def head_blocks(self):
        """lm_head as (first row, Param of consecutive rows) blocks in row order; a block is valid
        until the next one is asked for. Rows are independent, so blocking never changes a bit."""

    def stats(self) -> dict:
        return {}

    def close(self) -> None:
        """Release files and buffers."""
