"""The kept decode states: the longest strict prefix wins, a state is handed out once, the least recently
used goes first, and a state taken and advanced is the state a fresh forward of the same ids gives."""
from __future__ import annotations

import numpy as np
import pytest

from k3core import EngineConfig, StateCache, open_engine
from k3core.testing.engines import state_bytes


class S:
    def __init__(self, ids):
        self.ids = list(ids)


def test_the_longest_strict_prefix_is_taken_once():
    cache = StateCache(4)
    for ids in ([1], [1, 2], [1, 2, 3], [9, 9]):
        cache.put(S(ids))
    got = cache.take([1, 2, 3, 4])
    assert got.ids == [1, 2, 3] and cache.take([1, 2, 3, 4]).ids == [1, 2]
    assert cache.take([1, 2, 3]).ids == [1]  # equal ids are not a strict prefix: nothing left to forward
    assert cache.take([5]) is None and cache.take([9, 9]) is None  # [9, 9] itself is no strict prefix
    assert cache.stats() == {"kept_states": 1, "state_hits": 3, "state_misses": 2, "reused_tokens": 6}


def test_the_least_recently_used_goes_and_empty_states_are_not_kept():
    cache = StateCache(2)
    cache.put(S([1]))
    cache.put(S([2]))
    cache.put(S([]))
    cache.put(S([3, 3]))
    assert cache.kept_lengths() == [1, 2]  # [2] and [3, 3], least recently used first
    assert len(cache) == 2 and cache.take([1, 0]) is None and cache.take([3, 3, 0]).ids == [3, 3]
    off = StateCache(0)
    off.put(S([1]))
    assert len(off) == 0
    with pytest.raises(ValueError):
        StateCache(-1)


def test_a_taken_state_continues_exactly(small_model):
    with open_engine(EngineConfig(small_model)) as engine:
        cache = StateCache(2)
        state = engine.new_state()
        engine.forward([5, 6, 7], state)
        cache.put(state)
        kept = cache.take([5, 6, 7, 8, 9])
        logits = engine.forward([8, 9], kept)
        fresh = engine.new_state()
        want = engine.forward([5, 6, 7, 8, 9], fresh)
        assert np.array_equal(logits.view(np.uint32), want.view(np.uint32))
        assert state_bytes(engine, kept) == state_bytes(engine, fresh)


def test_the_memory_plan_counts_kept_states(small_model):
    from k3core import memory_plan

    plain = {r.item: r.bytes for r in memory_plan(EngineConfig(small_model, sequences=2)).rows}
    kept = {r.item: r.bytes for r in memory_plan(EngineConfig(small_model, sequences=2, kept_states=3)).rows}
    for kind in ("KDA", "MLA"):
        assert kept[f"kept {kind} states"] == plain[f"{kind} state"] // 2 * 3
    assert sum(kept.values()) > sum(plain.values())
