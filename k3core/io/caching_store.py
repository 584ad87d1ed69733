"""`CachingStore`: an expert store that keeps experts in an arena of slots sized by the cache budget and
lets a CachePolicy decide which stay. The built-in `lru` store is this with LRUPolicy; a plugin gets
another store by giving another policy (examples/k3-store-2q).

A slot is reserved before its read and published only after the whole read landed, so a failed read
never leaves a slot claiming an expert. Hits are TRUE hits: resident before the request, as the
policy says; `k3 sim-cache` replays the same policy object.

Prefetch: the engine names the experts it guesses a layer will route to before that layer's attention
runs; they are read in the background into staging slots beside the cache (the policy is not told).
A fetch that misses on a staged expert waits for that read and adopts its slot instead of reading; a
wrong guess costs only the read. Either way a fetch serves the same bytes. `prefetch_depth` d reads each token's
top d·k guesses (k: the router's top-k) into d·k staging slots: more of the next fetch staged, more bytes read.
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import UsageError
from ..interfaces import CachePolicy, ExpertStore, PlanRow, PluginOptions
from ..units import human
from ..files.aligned_io import Prefault, aligned_buffer
from .expert_io import QUEUE_DEPTH, ExpertReader, expert_slot_bytes


def all_experts(config) -> int:
    return (config.num_hidden_layers - config.first_k_dense_replace) * config.num_experts


def cache_slots(config, cache_gb: float, slot_bytes: int) -> int:
    """Slots for the budget: never fewer than one token's top-k, never more than the model has experts."""
    wanted = int(cache_gb * 1e9 // slot_bytes)
    return max(config.num_experts_per_token, min(wanted, all_experts(config)))


@dataclass(frozen=True)
class CachingOptions(PluginOptions):
    direct_io: bool = True  # O_DIRECT reads where the filesystem allows them
    prefetch: bool = True   # read the engine's guess of a layer's experts while its attention runs
    check_reads: bool = True  # each expert read against its recorded checksums; false only to measure their cost
    read_ahead: bool = True  # a prefill round's next experts read while this round computes; false only to measure it
    read_threads: int = QUEUE_DEPTH  # expert reads in flight at once (`k3 tune` measures what this disk likes)
    read_kib: int = 0        # an expert's bytes read in pieces of at most this many KiB (a multiple of 4); 0: whole
    prefetch_depth: int = 1  # how far down each token's ranked guess prefetch reads: depth × top-k experts


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
        rows = [PlanRow("expert cache", slots * slot, f"{slots} slots × {human(slot)}"
                        + (" (every expert of the model)" if slots == all_experts(ctx.config) else ""))]
        staged = staging_slots(ctx.config, slots, ctx.options)
        if staged:
            rows.append(PlanRow("expert prefetch", staged * slot, f"{staged} staging slots × {human(slot)} (guessed "
                                "experts read while attention runs, prefetch_depth × top-k; prefetch=false: none)"))
        return rows

    def __init__(self, ctx):
        super().__init__(ctx)
        self.reader = ExpertReader(self.checkpoint, self.options.direct_io, self.options.check_reads,
                                   self.options.read_threads, self.options.read_kib)
        self.slot_bytes = expert_slot_bytes(self.checkpoint)
        self.slots = cache_slots(self.config, ctx.budget.cache_gb, self.slot_bytes)
        self.keeper = self.policy(self.slots, self.options)
        staged = staging_slots(self.config, self.slots, self.options)
        arena = aligned_buffer((self.slots + staged) * self.slot_bytes, huge=True)
        self._prefault = Prefault(arena)
        self._arena = memoryview(arena)
        self._slot_of: dict[tuple[int, int], int] = {}   # resident key -> its slot
        self._weights: dict[int, object] = {}             # slot -> ExpertWeights viewing it
        self._free = list(range(self.slots - 1, -1, -1))  # slots the cache may fill
        self._spare = list(range(self.slots, self.slots + staged))  # slots a prefetch may fill
        self._staged: dict[tuple[int, int], tuple[int, object, int]] = {}  # key -> (slot, its read, index in it)
        self._prefetcher = ThreadPoolExecutor(1, thread_name_prefix="k3-prefetch") if staged else None
        self._ahead = ThreadPoolExecutor(1, thread_name_prefix="k3-expert-ahead")  # a prefill round's next reads
        self.requests = self.hits = self.prefetched = self.prefetch_used = 0
        self.wait_seconds = 0.0

    def capacity(self) -> int:
        return self.slots

    def prefetch_capacity(self) -> int:
        return len(self._spare) + len(self._staged)

    def prefetch(self, layer, experts):
        self._drop_staged()
        keys = [(layer, int(e)) for e in experts if (layer, int(e)) not in self._slot_of][:len(self._spare)]
        if not keys:
            return
        taken = [(key, self._spare.pop()) for key in keys]
        read = self._prefetcher.submit(self.reader.read, [(layer, key[1], self._slot(slot)) for key, slot in taken])
        for i, (key, slot) in enumerate(taken):
            self._staged[key] = (slot, read, i)
        self.prefetched += len(keys)

    def _drop_staged(self) -> None:
        """Wait for the staged reads nobody adopted and give their slots back to prefetch."""
        for slot, read, _ in self._staged.values():
            _landed(read)
            self._spare.append(slot)
        self._staged.clear()

    def _adopt(self, key):
        """The ExpertWeights of `key` if a prefetch read it completely (its slot joins the cache), else None."""
        slot, read, i = self._staged.pop(key)
        landed = _landed(read)
        if landed is None:  # that read failed: the fetch reads the expert itself, and raises if it fails again
            self._spare.append(slot)
            return None
        self._spare.append(self._free.pop())  # the cache gains the staged slot and gives prefetch one back
        self._slot_of[key] = slot
        self._weights[slot] = landed[i]
        self.prefetch_used += 1
        return landed[i]

    def held(self, layer):
        return sorted(e for (L, e) in self._slot_of if L == layer)

    def fetch(self, layer, experts):
        started = time.perf_counter()
        try:
            return self._finish(self._begin(layer, experts))
        finally:
            self.wait_seconds += time.perf_counter() - started

    def fetch_batches(self, layer, experts):
        """More experts than the cache holds (a prefill chunk's union): rounds of half the slots, the resident and
        staged experts first, each round's misses read on a background thread while the caller computes with
        the round before. Fewer: one fetch. A subclass that overrides `fetch` has every batch served by it."""
        experts = [int(e) for e in experts]
        half = self.slots // 2
        overridden = type(self).fetch is not CachingStore.fetch
        if len(experts) <= self.slots or half < 1 or not self.options.read_ahead or overridden:
            yield from super().fetch_batches(layer, experts)
            return
        waiting = {key[1]: 1 for key in self._staged if key[0] == layer}
        experts.sort(key=lambda e: 0 if (layer, e) in self._slot_of else waiting.get(e, 2))  # stable: asked order
        rounds = [experts[at:at + half] for at in range(0, len(experts), half)]
        started = time.perf_counter()
        pending = self._begin(layer, rounds[0], ahead=True)
        try:
            for i, now in enumerate(rounds):
                batch = self._finish(pending)
                pending = None
                if i + 1 < len(rounds):  # round i stays resident: it is kept while round i + 1 takes its slots
                    pending = self._begin(layer, rounds[i + 1], ahead=True, keep=now + rounds[i + 1])
                self.wait_seconds += time.perf_counter() - started
                yield batch
                started = time.perf_counter()
        finally:
            if pending is not None:  # the caller stopped early: that round's read lands before its slots move
                _settle(pending.read)
                self._release(pending.reserved)

    def _begin(self, layer, experts, ahead: bool = False, keep=None) -> "_Round":
        """Ask the policy about each expert, adopt staged reads, reserve slots for the misses and start reading
        them: on the background thread if `ahead`, else on this one when the round is finished."""
        keys = [(layer, int(e)) for e in experts]
        if len(keys) > self.slots:
            raise ValueError(f"{self.name} store has {self.slots} slots, asked for {len(keys)} experts at once")
        kept = [(layer, int(e)) for e in keep] if keep is not None else keys
        self.requests += len(keys)
        missing = []
        for key in keys:
            hit, evicted = self.keeper.access(key, keep=kept)
            if evicted is not None:
                slot = self._slot_of.pop(evicted)
                del self._weights[slot]
                self._free.append(slot)
            if hit:
                self.hits += 1
            elif key not in self._staged or self._adopt(key) is None:
                missing.append(key)
        reserved = [(key, self._free.pop()) for key in missing]  # in flight: not yet resident
        requests = [(layer, key[1], self._slot(slot)) for key, slot in reserved]
        read = self._ahead.submit(self.reader.read, requests) if ahead and requests else requests
        return _Round(keys, reserved, read)

    def _finish(self, pending: "_Round") -> list:
        """Wait for the round's reads and publish them (only a complete read is published); its experts' weights."""
        try:
            if pending.reserved:
                loaded = pending.read.result() if isinstance(pending.read, Future) else self.reader.read(pending.read)
            else:
                loaded = []
        except BaseException:
            _settle(pending.read)  # an interrupted wait: the read still writes into the slots until it lands
            self._release(pending.reserved)
            raise
        for (key, slot), weights in zip(pending.reserved, loaded):
            self._slot_of[key] = slot
            self._weights[slot] = weights
        return [self._weights[self._slot_of[key]] for key in pending.keys]

    def _release(self, reserved) -> None:
        for key, slot in reserved:
            self.keeper.discard(key)
            self._free.append(slot)

    def _slot(self, slot: int) -> memoryview:
        return self._arena[slot * self.slot_bytes:(slot + 1) * self.slot_bytes]

    def stats(self):
        return {"expert_requests": self.requests, "expert_hits": self.hits, "expert_evictions": self.keeper.evictions,
                "expert_bytes_read": self.reader.bytes_read, "expert_read_seconds": self.reader.seconds,
                "expert_wait_seconds": self.wait_seconds,
                "expert_read_mode": self.reader.mode, "expert_slots": self.slots, "expert_slot_bytes": self.slot_bytes,
                "expert_cache_bytes": self.slots * self.slot_bytes, "expert_prefetched": self.prefetched,
                "expert_prefetch_used": self.prefetch_used, "expert_reads_checked": self.options.check_reads,
                "expert_nan_scales": nan_scales(self.reader)}

    def close(self):
        self._prefault.stop()
        if self._prefetcher is not None:
            self._prefetcher.shutdown(wait=True)
        self._ahead.shutdown(wait=True)
        self.reader.close()


def nan_scales(reader) -> list[list[int]]:
    """[layer, expert, scale bytes of 255] of each expert read that has any (MODEL.md §5: zero groups, counted)."""
    return [[layer, expert, n] for (layer, expert), n in sorted(reader.nan_scales.items())]


MAX_PREFETCH_DEPTH = 8


def staging_slots(config, slots: int, options) -> int:
    """Staging slots for prefetch: `prefetch_depth` × one token's top-k (at most every expert of a layer), none when
    the cache holds every expert or prefetch is off."""
    depth = options.prefetch_depth
    if not (isinstance(depth, int) and not isinstance(depth, bool) and 1 <= depth <= MAX_PREFETCH_DEPTH):
        raise UsageError(f"prefetch_depth: how far down each token's ranked guess prefetch reads, in multiples of "
                         f"top-k, must be an integer in 1..{MAX_PREFETCH_DEPTH}, got {depth!r}")
    if not options.prefetch or slots >= all_experts(config):
        return 0
    return min(config.num_experts, depth * config.num_experts_per_token)


class _Round(NamedTuple):
    keys: list              # (layer, expert) in the order the caller gets them
    reserved: list          # (key, slot) of the misses, not resident until the read lands
    read: object            # a Future of the reads, or the requests to read when the round is finished


def _settle(read) -> None:
    """Wait for a background read to land, whatever it did (its slots are about to be given back)."""
    if isinstance(read, Future):
        wait([read])


def _landed(read):
    """The ExpertWeights a background read returned, or None if it raised."""
    try:
        return read.result()
    except Exception:
        return None
