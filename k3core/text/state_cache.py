"""Kept decode states, so a follow-up request forwards only its new ids (MODEL.md §4.5).

A bounded LRU of DecodeStates, each keyed by the ids it has consumed. `take(prompt)` hands out (and
removes) the state holding the longest strict prefix of `prompt`; the caller advances it and `put`s it
back under its new ids. A state is in one place at a time — in the cache or in one generation — so two
requests never advance the same state. Reuse changes no bits: a state that consumed a prefix is the
state forwarding that prefix gives (the incremental path is checked against full recompute).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence


class StateCache:
    def __init__(self, capacity: int):
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 0:
            raise ValueError(f"a state cache keeps 0 or more decode states, got {capacity!r}")
        self.capacity = capacity
        self._states: OrderedDict[tuple[int, ...], object] = OrderedDict()  # least recently used first
        self.hits = self.misses = self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._states)

    def take(self, prompt: Sequence[int]):
        """The kept state whose ids are the longest strict prefix of `prompt`, removed from the cache; None
        when no kept state is one."""
        prompt = tuple(int(t) for t in prompt)
        best = max((key for key in self._states if len(key) < len(prompt) and prompt[:len(key)] == key),
                   key=len, default=None)
        if best is None:
            self.misses += 1
            return None
        self.hits += 1
        self.reused_tokens += len(best)
        return self._states.pop(best)

    def put(self, state) -> None:
        """Keep `state` under the ids it holds (an empty one is not worth keeping); the least recently
        used state goes when the cache is over capacity."""
        key = tuple(state.ids)
        if not key or self.capacity == 0:
            return
        self._states.pop(key, None)
        self._states[key] = state
        while len(self._states) > self.capacity:
            self._states.popitem(last=False)

    def kept_lengths(self) -> list[int]:
        """How many ids each kept state holds, least recently used first."""
        return [len(key) for key in self._states]

    def clear(self) -> None:
        self._states.clear()

    def stats(self) -> dict:
        return {"kept_states": len(self._states), "state_hits": self.hits, "state_misses": self.misses,
                "reused_tokens": self.reused_tokens}
