"""`CachingStore`: an expert store that keeps experts in an arena of slots sized by the cache budget and
lets a CachePolicy decide which stay. The built-in `lru` store is this with LRUPolicy; a plugin gets
another store by giving another policy (examples/k3-store-2q).

A slot is reserved before its read and published only after the whole read landed, so a failed read
never leaves a slot claiming an expert. Hits are TRUE hits: resident before the request, as the
policy says; `k3 sim-cache` replays the same policy object.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..interfaces import CachePolicy, ExpertStore, PlanRow, PluginOptions
from ..model.budget import human
from .aligned_io import aligned_buffer
from .expert_io import ExpertReader, expert_slot_bytes


def all_experts(config) -> int:
    return (config.num_hidden_layers - config.first_k_dense_replace) * config.num_experts


def cache_slots(config, cache_gb: float, slot_bytes: int) -> int:
    """Slots for the budget: never fewer than one token's top-k, never more than the model has experts."""
    wanted = int(cache_gb * 1e9 // slot_bytes)
    return max(config.num_experts_per_token, min(wanted, all_experts(config)))


@dataclass(frozen=True)
class CachingOptions(PluginOptions):
    direct_io: bool = True  # O_DIRECT reads where the filesystem allows them


class CachingStore(ExpertStore):
    """Subclass with a `name`, and `policy(slots, options)` returning the CachePolicy to keep by.
    Options must include `direct_io` (subclass CachingOptions)."""

    Options = CachingOptions

    @classmethod
    def policy(cls, slots: int, options) -> CachePolicy:
        raise NotImplementedError(f"expert store {cls.name!r} must say which CachePolicy keeps its slots")

    @classmethod
    def cache_policy(cls, slots, options=None):
        return cls.policy(slots, options or cls.Options())

    @classmethod
    def plan(cls, ctx):
        slot = expert_slot_bytes(ctx.checkpoint)
        slots = cache_slots(ctx.config, ctx.budget.cache_gb, slot)
        return [PlanRow("expert cache", slots * slot, f"{slots} slots × {human(slot)}"
                        + (" (every expert of the model)" if slots == all_experts(ctx.config) else ""))]

    def __init__(self, ctx):
        super().__init__(ctx)
        self.reader = ExpertReader(self.checkpoint, direct_io=self.options.direct_io)
        self.slot_bytes = expert_slot_bytes(self.checkpoint)
        self.slots = cache_slots(self.config, ctx.budget.cache_gb, self.slot_bytes)
        self.keeper = self.policy(self.slots, self.options)
        self._arena = memoryview(aligned_buffer(self.slots * self.slot_bytes))
        self._slot_of: dict[tuple[int, int], int] = {}   # resident key -> its slot
        self._weights: dict[int, object] = {}             # slot -> ExpertWeights viewing it
        self._free = list(range(self.slots - 1, -1, -1))
        self.requests = self.hits = 0

    def capacity(self) -> int:
        return self.slots

    def fetch(self, layer, experts):
        keys = [(layer, int(e)) for e in experts]
        if len(keys) > self.slots:
            raise ValueError(f"{self.name} store has {self.slots} slots, asked for {len(keys)} experts at once")
        self.requests += len(keys)
        missing = []
        for key in keys:
            hit, evicted = self.keeper.access(key, keep=keys)
            if evicted is not None:
                slot = self._slot_of.pop(evicted)
                del self._weights[slot]
                self._free.append(slot)
            if hit:
                self.hits += 1
            else:
                missing.append(key)
        reserved = [(key, self._free.pop()) for key in missing]  # in flight: not yet resident
        try:
            loaded = self.reader.read([(layer, key[1], self._slot(slot)) for key, slot in reserved])
        except BaseException:
            for key, slot in reserved:
                self.keeper.discard(key)
                self._free.append(slot)
            raise
        for (key, slot), weights in zip(reserved, loaded):  # published only after a complete read
            self._slot_of[key] = slot
            self._weights[slot] = weights
        return [self._weights[self._slot_of[key]] for key in keys]

    def _slot(self, slot: int) -> memoryview:
        return self._arena[slot * self.slot_bytes:(slot + 1) * self.slot_bytes]

    def stats(self):
        return {"expert_requests": self.requests, "expert_hits": self.hits, "expert_evictions": self.keeper.evictions,
                "expert_bytes_read": self.reader.bytes_read, "expert_read_seconds": self.reader.seconds,
                "expert_read_mode": self.reader.mode, "expert_slots": self.slots, "expert_slot_bytes": self.slot_bytes,
                "expert_cache_bytes": self.slots * self.slot_bytes}

    def close(self):
        self.reader.close()
