"""The typed interfaces a plugin implements or receives: one per replaceable kind, the context the
engine hands a placer or store (checkpoint, budget, the plugin's own options), and the cache policy
a store and `k3 sim-cache` share. Plugins reach all of it through k3core.plugin_api; the contract in
words is docs/PLUGINS.md. Arrays are numpy; activations crossing an interface are float32, C-contiguous.
"""
from __future__ import annotations

import math
import os
import typing
from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Iterable, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

from .errors import CheckpointError, UsageError

if TYPE_CHECKING:
    from .format.config import Config


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
        """The values widened to float32 (exact for BF16 and F16, whose bits may come as uint16)."""
        if self.dtype == "BF16":
            return (self.data.astype(np.uint32) << 16).view(np.float32)
        if self.dtype == "F16":
            return self.data.view(np.float16).astype(np.float32)
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
        """A small tensor widened to float32 (MODEL.md §3: widen small vectors at load)."""
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


# ---- what a placer or store is given ---------------------------------------------------------------

@dataclass(frozen=True)
class PluginOptions:
    """A trunk placer's or expert store's own options: subclass it as a frozen dataclass whose fields
    all have defaults, and name the subclass in the plugin's `Options`. The base has no fields: a
    plugin that keeps it takes no options."""

    @classmethod
    def build(cls, given, owner: str) -> "PluginOptions":
        """`given` (a mapping, an instance of this class, or None) checked and turned into an instance.
        An unknown name or a wrong type is a UsageError naming it and the valid options."""
        if isinstance(given, cls):
            return given
        if isinstance(given, PluginOptions):
            raise UsageError(f"{owner} takes {cls.__qualname__} options, got {type(given).__qualname__}")
        if given is not None and not isinstance(given, Mapping):
            raise UsageError(f"{owner}: options must be a mapping of name to value, got {type(given).__name__}")
        given = dict(given or {})
        hints = typing.get_type_hints(cls)
        known = [f.name for f in fields(cls)]
        valid = (f"its options are: {', '.join(f'{n} ({_type_name(hints[n])})' for n in known)}" if known
                 else "it takes no options")
        unknown = sorted(set(given) - set(known), key=str)
        if unknown:
            raise UsageError(f"{owner} has no option {', '.join(map(repr, unknown))}; {valid}")
        wrong = [f"{name} must be {_type_name(hints[name])}, got {value!r}" for name, value in given.items()
                 if not _has_type(value, hints[name])]
        missing = [f.name for f in fields(cls) if f.name not in given and f.default is MISSING
                   and f.default_factory is MISSING]
        if missing:
            wrong.append(f"{', '.join(missing)} must be given (no default)")
        if wrong:
            raise UsageError(f"{owner}: " + "; ".join(wrong))
        return cls(**given)


def _type_name(kind) -> str:
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if args:
        return " or ".join(_type_name(a) for a in args) + (" or None" if type(None) in typing.get_args(kind) else "")
    return getattr(kind, "__name__", str(kind))


def _has_type(value, kind) -> bool:
    args = typing.get_args(kind)
    if args:
        return any(_has_type(value, a) for a in args)
    if kind is type(None):
        return value is None
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind) if isinstance(kind, type) else True


@dataclass(frozen=True)
class Budget:
    """The memory budgets in force, presets already applied (EngineConfig.budget())."""

    cache_gb: float                    # the expert store's RAM
    trunk_dir: Path | None = None      # the packed trunk (`k3 pack`), None when there is none
    trunk_gb: float | None = None      # pinned trunk layers + the ring; None: no limit
    ring_slots: int = 2                # slots of the streaming ring
    pinned_layers: int | None = None   # pin exactly this many layers instead of what trunk_gb holds
    preset: str | None = None          # the preset the numbers came from, if any


@dataclass(frozen=True)
class PluginContext:
    """What a trunk placer or an expert store is built from: the opened checkpoint (`root`, `config`,
    `index`: tensor name -> file, offset, nbytes, shape, dtype), the budgets, and its own options."""

    checkpoint: Any
    budget: Budget
    options: PluginOptions

    @property
    def config(self):
        return self.checkpoint.config


class PlanRow(NamedTuple):
    """One line of the memory plan: what is held, how many bytes, and how that was counted."""

    item: str
    bytes: int
    detail: str


def io_seconds(stats: Mapping) -> tuple[float, float]:
    """(seconds with a trunk or expert read in flight, seconds the forward passes stood waiting for one) in an
    engine's stats (STORE_STATS, PLACER_STATS); a store that does not count its waits waited for every read."""
    read = stats.get("trunk_read_seconds", 0.0) + stats.get("expert_read_seconds", 0.0)
    return read, stats.get("trunk_wait_seconds", 0.0) + stats.get("expert_wait_seconds",
                                                                   stats.get("expert_read_seconds", 0.0))


def default_threads() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# The kernel families whose threads KernelBackend.set_family_threads caps: dense (linear, int8_linear, int4_linear),
# experts (mxfp4_linear, expert), attention (kda_recurrence, mqa_attention, short_conv, kda_decay), other (the rest).
KERNEL_FAMILIES = ("dense", "experts", "attention", "other")


# ---- the replaceable kinds -------------------------------------------------------------------------

class KernelBackend(ABC):
    """The numeric kernels. Every backend follows docs/NUMERICS.md's accumulation order."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
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


class AttentionBackend(ABC):
    """One attention kind for the layers the config gives it (`config.attention_kind(layer)`)."""

    kind: ClassVar[str]
    name: ClassVar[str]
    # Names among state_arrays whose first axis is the position (MLA's cached keys): the prompt cache keeps their
    # rows once per position, shared by every kept prefix through it; any other array is kept whole per checkpoint.
    positional: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def tensor_specs(self, config: Config, layer: int) -> list[TensorSpec]:
        """Tensors this backend reads, named relative to `layers.{layer}.`."""

    @abstractmethod
    def new_state(self, config: Config, layer: int) -> Any:
        """The empty decode state of a layer (it must support copy.deepcopy)."""

    @abstractmethod
    def state_bytes(self, config: Config, layer: int, context: int) -> int:
        """Bytes the decode state of `layer` holds after `context` positions (for the memory plan)."""

    @abstractmethod
    def forward(self, w: Weights, x: np.ndarray, state: Any, config: Config, kernels: KernelBackend) -> np.ndarray:
        """Consume T new tokens x [T, H] (already input_layernorm-ed), advancing `state` (the engine calls this
        when a pass carries one sequence, forward_batch when it carries several)."""

    def forward_batch(self, w: Weights, x: np.ndarray, segments: Sequence[tuple[int, int, Any]], config: Config,
                      kernels: KernelBackend) -> np.ndarray:
        """Several sequences in one pass: `segments` lists (start, stop, state), the rows of x [T, H] each
        sequence owns, in order and covering x. Returns [T, H], each segment's rows exactly what `forward`
        gives it alone. This default runs `forward` per segment; a backend may share its projections over
        all rows instead (kernels give a row the same bits in any batch)."""
        return np.concatenate([self.forward(w, x[a:b], state, config, kernels) for a, b, state in segments])

    def mark(self, state: Any) -> None:
        """Remember where `state` stands, so that `rollback` can return it to any position forwarded after
        this (speculative decoding verifies drafted ids, then keeps only the accepted ones)."""
        raise NotImplementedError(f"attention backend {self.name!r} cannot roll back its decode state, which "
                                  "speculative decoding (--speculate) needs")

    def rollback(self, state: Any, kept: int, config: Config, kernels: KernelBackend) -> None:
        """Make `state` hold the marked position plus the first `kept` positions forwarded since, bit for bit
        as if only those had been forwarded; the mark is then gone (`kept` = all of them just drops it)."""
        raise NotImplementedError(f"attention backend {self.name!r} cannot roll back its decode state")

    def rollback_bytes(self, config: Config, layer: int, positions: int) -> int:
        """Bytes a mark holds while `positions` positions are forwarded after it (for the memory plan)."""
        raise NotImplementedError(f"attention backend {self.name!r} cannot roll back its decode state")

    def keep_at(self, state: Any, positions: Sequence[int]) -> None:
        """Before a forward of `state`: keep its arrays that are not `positional` as they stand after each of
        `positions` of the rows that forward brings (0 < p < rows), for `kept` to hand out — what the prompt cache
        keeps at a checkpoint inside a pass, which is not cut there (a pass of the real model reads its weights)."""
        raise NotImplementedError(f"attention backend {self.name!r} cannot keep its state inside a pass, which the "
                                  "prompt cache needs (--prompt-cache-gb 0 --prompt-cache off runs without it)")

    def kept(self, state: Any) -> dict[int, dict[str, np.ndarray]]:
        """What `keep_at` asked for, by position, after the forward; handed out once."""
        raise NotImplementedError(f"attention backend {self.name!r} cannot keep its state inside a pass")

    def state_arrays(self, state: Any) -> dict[str, np.ndarray]:
        """The state as named arrays, for state files (chat /save) and the prompt cache; the arrays may be views
        of the state's own (callers copy what they keep)."""
        raise NotImplementedError(f"attention backend {self.name!r} cannot save its decode state")

    def state_from_arrays(self, config: Config, layer: int, arrays: Mapping[str, np.ndarray]) -> Any:
        """The inverse of state_arrays."""
        raise NotImplementedError(f"attention backend {self.name!r} cannot load a decode state")


class CachePolicy(ABC):
    """Which experts a store keeps, as a pure decision rule over (layer, expert) keys with `slots`
    places: the store asks it on every request, and `k3 sim-cache` replays a recorded trace through
    the very same object without reading anything. Every miss becomes resident."""

    def __init__(self, slots: int):
        self.slots = slots
        self.evictions = 0

    @abstractmethod
    def access(self, key: tuple[int, int], keep: Sequence[tuple[int, int]] = ()) -> tuple[bool, tuple | None]:
        """One request for `key`: (hit, evicted). `hit` is True if `key` was resident before it (a
        TRUE hit). On a miss `key` becomes resident; when every place was taken, `evicted` is the key
        that left to make room, never one of `keep` (the other keys of the same fetch)."""

    @abstractmethod
    def discard(self, key: tuple[int, int]) -> None:
        """`key` is not resident after all (its read failed)."""


class LRUPolicy(CachePolicy):
    """Least recently used out: the `lru` store's rule, and the reference row of `k3 sim-cache`."""

    def __init__(self, slots: int):
        super().__init__(slots)
        self._order: OrderedDict = OrderedDict()  # least recently used first

    def access(self, key, keep=()):
        if key in self._order:
            self._order.move_to_end(key)
            return True, None
        evicted = None
        if len(self._order) >= self.slots:
            evicted = next((k for k in self._order if k not in keep), None)
            if evicted is None:
                raise ValueError(f"an LRU of {self.slots} places cannot keep {len(keep)} experts at once")
            del self._order[evicted]
            self.evictions += 1
        self._order[key] = None
        return False, evicted

    def discard(self, key):
        self._order.pop(key, None)


class ExpertStore(ABC):
    """Where routed experts come from: read on demand, cached, or otherwise.

    Call order: `plan(ctx)` (before anything loads; may be called without ever building the store),
    `__init__(ctx)`, then any number of `fetch`, `fetch_batches`, `capacity` and `stats` calls from one thread, then
    `close()` once. A fetch's ExpertWeights may view the store's buffers: they stay valid until the
    next fetch, and must then never change under a caller still holding them."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    Options: ClassVar[type[PluginOptions]] = PluginOptions

    @classmethod
    def plan(cls, ctx: PluginContext) -> list[PlanRow]:
        """What this store would hold in RAM, for the memory plan."""
        return []

    @classmethod
    def cache_policy(cls, slots: int, options: PluginOptions | None = None) -> CachePolicy | None:
        """The store's retention rule for `slots` expert slots under `options` (None: the defaults, as
        `k3 sim-cache` asks); None for a store that keeps nothing."""
        return None

    def __init__(self, ctx: PluginContext):
        self.ctx, self.checkpoint, self.config, self.options = ctx, ctx.checkpoint, ctx.config, ctx.options

    def capacity(self) -> int:
        """How many distinct experts one fetch may ask for (at least the router's top-k)."""
        return self.config.num_experts_per_token

    def prefetch_capacity(self) -> int:
        """How many guessed experts one `prefetch` may start reading; 0 (the default): the store takes no hints."""
        return 0

    def held(self, layer: int) -> Sequence[int]:
        """The experts of `layer` whose bytes this store holds now, so that fetching them reads nothing: what a draft
        model run with --draft-cache-only routes to. The default: none (a store that keeps nothing)."""
        return ()

    def prefetch(self, layer: int, experts: Sequence[int]) -> None:
        """A hint, before `layer`'s attention runs: `experts` (distinct, likeliest first, at most
        prefetch_capacity()) will probably be fetched next. Start reading them if that pays; a guess may be
        wrong, and what a later fetch serves must not depend on it. The default ignores it."""

    @abstractmethod
    def fetch(self, layer: int, experts: Sequence[int]) -> list[ExpertWeights]:
        """The distinct experts of `layer`, in the order asked. A failed or short read raises
        UnsoundRunError; it never returns other bytes."""

    def fetch_batches(self, layer: int, experts: Sequence[int]) -> Iterator[list[ExpertWeights]]:
        """Every one of the distinct `experts` of `layer` (any number, more than capacity() too) exactly once, in
        batches of at most capacity(); a batch's ExpertWeights stay valid until the next batch is asked for. The
        default fetches capacity() at a time, in the order asked; a store may reorder and may read the next batch
        while the caller computes with this one (CachingStore does: reads behind compute in prefill)."""
        step = self.capacity()
        for at in range(0, len(experts), step):
            yield self.fetch(layer, experts[at:at + step])

    def stats(self) -> dict:
        """Counters under the names in STORE_STATS (plugin_api)."""
        return {}

    def close(self) -> None:
        """Release files and buffers."""


class TrunkPlacer(ABC):
    """Which trunk (non-expert) tensors stay in RAM and how the others arrive.

    Call order: `plan(ctx)`, `__init__(ctx)`, then per forward pass `embed_rows`, `layer(L)` for
    L = 0, 1, … in order, `model()`, `head_blocks()`; `stats()` any time; `close()` once. What
    `layer` and `head_blocks` hand out stays valid until the next such call. The engine scans the F32/F16
    tensors of each Weights object `layer` and `model` return for NaN and infinity when it first sees that
    object: return the same object again only while its values are unchanged (a pinned layer), and values
    read anew (a streamed layer) in a new object."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    Options: ClassVar[type[PluginOptions]] = PluginOptions

    @classmethod
    def plan(cls, ctx: PluginContext) -> list[PlanRow]:
        """What this placer would hold in RAM, for the memory plan."""
        return []

    @classmethod
    def streamed_bytes(cls, ctx: PluginContext) -> int:
        """Trunk bytes one forward pass reads from disk under this plan (as stored); the prefill chunk `auto`
        picks weighs them (plan/prefill.py). The default, 0, says every trunk tensor stays in RAM."""
        return 0

    def __init__(self, ctx: PluginContext):
        self.ctx, self.checkpoint, self.config, self.options = ctx, ctx.checkpoint, ctx.config, ctx.options

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

    def stats(self) -> dict:
        """Counters under the names in PLACER_STATS (plugin_api)."""
        return {}

    def close(self) -> None:
        """Release files and buffers."""


class DraftSource(ABC):
    """Proposes the ids a generation might continue with, for speculative decoding. The engine forwards the
    last id and up to k proposed ones in one pass and keeps the longest prefix the model itself would have
    produced; a wrong proposal costs time, never a different id.

    Built by the engine as `cls(argument)` (the text after `:` in --draft NAME:ARGUMENT, or None), then
    `begin(prompt)` once per generation and `propose(history, generated, k)` before each verify pass."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    memory_bytes: ClassVar[int] = 0  # what it keeps across generations unless told (`reserve`); the plan counts it
    uses_draft_model: ClassVar[bool] = False  # it runs DraftTarget.draft_model: the engine must hold one
    hidden_layers: ClassVar[tuple[int, ...]] = ()  # the model's layers whose hidden states it reads (see_hidden)

    def __init__(self, argument: str | None = None):
        self.argument = argument

    def attach(self, target: DraftTarget) -> None:
        """Called once before `begin` with what the engine offers a draft source (DraftTarget): the model's config
        and, when the engine was opened with a draft trunk, its draft model. A source that needs something the
        engine lacks refuses here (a UsageError saying how to open it)."""

    @classmethod
    def reserve(cls, memory_bytes: int) -> None:
        """Keep what this source learns across generations within `memory_bytes` (--draft-memory), from now on."""

    @classmethod
    def example_argument(cls, directory) -> str | None:
        """An argument the conformance kit can build this source with, using files it may write under
        `directory` (a Path); None when it takes no argument."""
        return None

    def check(self, vocab_size: int) -> None:
        """Refuse, before anything is generated, an argument this model cannot use (a UsageError naming it): an id
        past the vocabulary of `vocab_size` ids would otherwise stop a generation mid-stream."""

    def begin(self, prompt: Sequence[int]) -> None:
        """A generation starts after `prompt`."""

    def end(self, history: Sequence[int]) -> None:
        """The generation ended; `history` is its prompt and the ids it kept (a source that learns across
        generations records them here)."""

    @abstractmethod
    def propose(self, history: Sequence[int], generated: int, k: int) -> list[int]:
        """Up to `k` ids to follow `history` (prompt + the `generated` ids emitted so far); fewer, or none,
        when there is nothing worth proposing."""

    def see_hidden(self, layer: int, position: int, rows: np.ndarray) -> None:
        """For a source that lists `hidden_layers` (a trained draft head: EAGLE-style heads read a few of the model's
        hidden states): the model's hidden state after `layer` at positions position … position + n − 1 of this
        generation's sequence, float32 [n, H] — the residual stream's plain sum (the embedding plus every layer's
        output so far), from every pass that forwards ids: the prompt's chunks and each verify pass, whose rows
        include drafts it then rejects (the next propose's history says which ids were kept). Positions the decode
        state already held (a kept conversation, a prompt cache hit) are not replayed. The array is the engine's and
        valid during the call only: copy what you keep. Never called for a source that lists no layers."""

    def proposal_cost(self, k: int) -> tuple[float, float]:
        """(weight bytes touched in RAM, bytes read from disk) of proposing `k` ids: what `--speculate auto` charges a
        draft beside the verify pass it fills. (0, 0) for a lookup; a draft model's forwards cost their weights."""
        return 0.0, 0.0

    def state_ids(self) -> Sequence[int] | None:
        """The ids a source that keeps a decode state holds (after propose: the history it was given, or a prefix of
        it, then its own drafts); None for a source without one. The conformance kit checks a state follows the
        accepted ids: one that kept a rejected draft would drift from the text it drafts for."""
        return None


@dataclass(frozen=True)
class DraftTarget:
    """What the engine offers a draft source (DraftSource.attach): the model's `config`; `embed` and `head_logits`, the
    model's own embedding and output head (what a trained draft head shares with it); and `draft_model`, the model run
    on a draft trunk (`k3 pack --draft`, opened with --draft-trunk) with fewer routed experts per token, or None. It is
    used as the engine is: `new_state()`, `forward(ids, state, all_logits=False)` → logits, `mark(state)` and
    `rollback(state, kept)` (keep the first `kept` ids forwarded since the mark), `prefill_chunk` (ids per forward, at
    most), `forward_cost()` (bytes touched and read per id forwarded, for DraftSource.proposal_cost); and it keeps
    states between generations for the sources that run on it: `take_state(prompt)` gives the kept state holding the
    longest strict prefix of `prompt` (or a fresh one), `keep_state(state)` gives one back (a state must hold a strict
    prefix of the history it was given, without a mark)."""

    config: Config
    draft_model: Any = None
    embed: Any = None        # ids -> the model's embedding rows, float32 [T, H]
    head_logits: Any = None  # hidden rows float32 [T, H] -> the model's final norm and lm_head: logits [T, V]
