"""An expert store for k3 kept by the 2Q policy (Johnson & Shasha, VLDB 1994), as a plugin from outside.

2Q keeps two resident queues: new experts enter A1in (first in, first out); an expert asked for again
after it left A1in — remembered in a ghost list A1out that holds keys, not bytes — goes to Am, an LRU
of experts used more than once. One pass over many experts (a long prompt's routing) only churns A1in,
so the experts every token uses stay in Am. Only k3core.plugin_api is used: the slot arena, reads and
budget accounting are CachingStore's; this package is the policy and its options.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from k3core.plugin_api import CachePolicy, CachingOptions, CachingStore, UsageError, hookimpl

__version__ = "0.1.0"


class TwoQPolicy(CachePolicy):
    """2Q over (layer, expert) keys with `slots` resident places."""

    def __init__(self, slots: int, a1in_fraction: float = 0.25, ghost_fraction: float = 0.5):
        super().__init__(slots)
        if not 0 < a1in_fraction <= 1 or not 0 < ghost_fraction <= 4:
            raise UsageError(f"twoq store: a1in_fraction must be in (0, 1] and ghost_fraction in (0, 4], got "
                             f"{a1in_fraction} and {ghost_fraction}")
        self.kin = max(1, round(a1in_fraction * slots))
        self.kout = max(1, round(ghost_fraction * slots))
        self.a1in: OrderedDict = OrderedDict()   # resident, seen once: oldest first
        self.am: OrderedDict = OrderedDict()     # resident, seen again: least recently used first
        self.a1out: OrderedDict = OrderedDict()  # ghosts: keys that left a1in, oldest first

    def access(self, key, keep=()):
        if key in self.am:
            self.am.move_to_end(key)
            return True, None
        if key in self.a1in:  # a second use while still new does not promote (2Q's correlated-reference rule)
            return True, None
        evicted = self._reclaim(keep) if len(self.a1in) + len(self.am) >= self.slots else None
        if key in self.a1out:
            del self.a1out[key]
            self.am[key] = None
        else:
            self.a1in[key] = None
        return False, evicted

    def _reclaim(self, keep):
        """Free one place: the oldest of A1in once it holds more than its share, else Am's least recent."""
        first, second = (self.a1in, self.am) if len(self.a1in) > self.kin or not self.am else (self.am, self.a1in)
        for queue in (first, second):
            victim = next((k for k in queue if k not in keep), None)
            if victim is not None:
                del queue[victim]
                if queue is self.a1in:
                    self.a1out[victim] = None
                    while len(self.a1out) > self.kout:
                        self.a1out.popitem(last=False)
                self.evictions += 1
                return victim
        raise ValueError(f"a 2Q of {self.slots} places cannot keep {len(keep)} experts at once")

    def discard(self, key):
        self.a1in.pop(key, None)
        self.am.pop(key, None)


@dataclass(frozen=True)
class TwoQOptions(CachingOptions):
    a1in_fraction: float = 0.25   # share of the slots for experts seen once
    ghost_fraction: float = 0.5   # ghost keys remembered, as a multiple of the slots


class TwoQStore(CachingStore):
    name = "twoq"
    description = "experts used more than once survive one-off scans (2Q: A1in FIFO, A1out ghosts, Am LRU)"
    Options = TwoQOptions

    @classmethod
    def policy(cls, slots, options):
        return TwoQPolicy(slots, options.a1in_fraction, options.ghost_fraction)


@hookimpl
def k3_expert_stores():
    return [TwoQStore]
