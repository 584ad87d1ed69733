"""The `lru` expert store: an arena of expert slots sized by --cache-gb, least recently used out.

A slot is reserved before its read and published only after the whole read landed, so a failed
read never leaves a slot claiming an expert. Hits are TRUE hits: resident before the request.
"""
from __future__ import annotations

from collections import OrderedDict

from ..io.expert_io import ExpertReader, aligned_buffer, expert_slot_bytes
from ..model.budget import human
from ..hookspecs import hookimpl
from ..interfaces import CachePolicy, ExpertStore

DEFAULT_CACHE_GB = 1.0


def all_experts(config) -> int:
    return (config.num_hidden_layers - config.first_k_dense_replace) * config.num_experts


def cache_slots(config, options, slot_bytes: int) -> int:
    """Slots for --cache-gb: never fewer than one token's top-k, never more than the model has experts."""
    wanted = int(float(options.get("cache_gb", DEFAULT_CACHE_GB)) * 1e9 // slot_bytes)
    return max(config.num_experts_per_token, min(wanted, all_experts(config)))


class LRUPolicy(CachePolicy):
    """The retention rule the store follows, for `k3 sim-cache`."""

    def __init__(self, slots):
        super().__init__(slots)
        self._order: OrderedDict = OrderedDict()
        self.evictions = 0

    def access(self, key):
        if key in self._order:
            self._order.move_to_end(key)
            return True
        if len(self._order) >= self.slots > 0:
            self._order.popitem(last=False)
            self.evictions += 1
        if self.slots > 0:
            self._order[key] = None
        return False


class LRUStore(ExpertStore):
    name = "lru"
    description = "keep recently used experts in a slot arena of --cache-gb; least recently used out"

    def __init__(self, checkpoint, config, options):
        super().__init__(checkpoint, config, options)
        self.reader = ExpertReader(checkpoint, direct_io=self.options.get("direct_io", True))
        self.slot_bytes = expert_slot_bytes(checkpoint)
        self.slots = cache_slots(config, self.options, self.slot_bytes)
        self._arena = memoryview(aligned_buffer(self.slots * self.slot_bytes))
        self._resident: OrderedDict[tuple[int, int], int] = OrderedDict()  # key -> slot, LRU first
        self._weights: dict[int, object] = {}  # slot -> ExpertWeights viewing it
        self._free = list(range(self.slots - 1, -1, -1))
        self.requests = self.hits = self.evictions = 0

    @classmethod
    def cache_policy(cls, slots):
        return LRUPolicy(slots)

    @classmethod
    def plan(cls, checkpoint, config, options):
        slot = expert_slot_bytes(checkpoint)
        slots = cache_slots(config, options, slot)
        return [("expert cache", slots * slot, f"{slots} slots × {human(slot)}"
                 + (" (every expert of the model)" if slots == all_experts(config) else ""))]

    def capacity(self) -> int:
        return self.slots

    def fetch(self, layer, experts):
        keys = [(layer, int(e)) for e in experts]
        if len(keys) > self.slots:
            raise ValueError(f"lru store has {self.slots} slots, asked for {len(keys)} experts at once")
        self.requests += len(keys)
        missing = []
        for key in keys:
            if key in self._resident:
                self._resident.move_to_end(key)
                self.hits += 1
            else:
                missing.append(key)
        reserved = [(key, self._take_slot(keys)) for key in missing]  # in flight: not yet resident
        try:
            loaded = self.reader.read([(layer, key[1], self._slot(slot)) for key, slot in reserved])
        except BaseException:
            self._free.extend(slot for _, slot in reserved)
            raise
        for (key, slot), weights in zip(reserved, loaded):  # published only after a complete read
            self._resident[key] = slot
            self._weights[slot] = weights
        return [self._weights[self._resident[key]] for key in keys]

    def _take_slot(self, keep) -> int:
        if self._free:
            return self._free.pop()
        for key in self._resident:  # least recently used first, never one this fetch asked for
            if key not in keep:
                self.evictions += 1
                slot = self._resident.pop(key)
                del self._weights[slot]
                return slot
        raise AssertionError("no slot to evict although the arena holds a whole fetch")

    def _slot(self, slot: int) -> memoryview:
        return self._arena[slot * self.slot_bytes:(slot + 1) * self.slot_bytes]

    def stats(self):
        return {"expert_requests": self.requests, "expert_hits": self.hits, "expert_evictions": self.evictions,
                "expert_bytes_read": self.reader.bytes_read, "expert_read_seconds": self.reader.seconds,
                "expert_read_mode": self.reader.mode, "expert_slots": self.slots,
                "expert_cache_bytes": self.slots * self.slot_bytes}

    def close(self):
        self.reader.close()


@hookimpl(trylast=True)
def k3_expert_stores():
    return [LRUStore]
