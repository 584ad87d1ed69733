"""The expert store kind: where routed experts come from, and the cache policy a store and `k3 sim-cache`
share."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from typing import Iterator, Sequence

from .base import ContextPlugin, PluginOptions
from .tensors import ExpertWeights


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


class ExpertStore(ContextPlugin):
    """Where routed experts come from: read on demand, cached, or otherwise.

    Call order: `plan(ctx)` (before anything loads; may be called without ever building the store),
    `__init__(ctx)`, then any number of `fetch`, `fetch_batches`, `capacity` and `stats` calls from one thread, then
    `close()` once. A fetch's ExpertWeights may view the store's buffers: they stay valid until the
    next fetch, and must then never change under a caller still holding them. `stats()` counts under the names in
    STORE_STATS (plugin_api)."""

    @classmethod
    def cache_policy(cls, slots: int, options: PluginOptions | None = None) -> CachePolicy | None:
        """The store's retention rule for `slots` expert slots under `options` (None: the defaults, as
        `k3 sim-cache` asks); None for a store that keeps nothing."""
        return None

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
