"""Expert stores (`direct`, `lru`): the bytes served for expert b are b's own (every expert's bytes
in a test model differ, so serving a's for b fails); hits are TRUE hits; a short read is unsound
and leaves no slot claiming the expert."""
import shutil

import numpy as np
import pytest

from k3core.format.checkpoint import EXPERT_PARTS, expert_prefix, open_checkpoint
from k3core.errors import UnsoundRunError
from k3core.plugin_api import Budget, LRUPolicy, PluginContext
from k3core.plugins.direct_store import DirectStore
from k3core.plugins.lru_store import LRUStore

FIELDS = ("w1_packed", "w1_scale", "w2_packed", "w2_scale", "w3_packed", "w3_scale")


def build(store_class, ckpt, cache_gb):
    return store_class(PluginContext(ckpt, Budget(cache_gb=cache_gb), store_class.Options()))


def assert_own_bytes(ckpt, got):
    for e in got:
        for part, field in zip(EXPERT_PARTS, FIELDS):
            assert np.array_equal(getattr(e, field), ckpt.index.read(expert_prefix(e.layer, e.expert) + part))


def test_every_expert_of_a_test_model_has_distinct_bytes(tiny_model):
    ckpt = open_checkpoint(tiny_model)
    packed = {ckpt.index.read(expert_prefix(L, e) + "w1.weight_packed").tobytes()
              for L in range(1, 13) for e in range(8)}
    assert len(packed) == 12 * 8


@pytest.mark.parametrize("store_class", [DirectStore, LRUStore])
def test_serves_each_expert_s_own_bytes_in_the_order_asked(tiny_model, store_class):
    ckpt = open_checkpoint(tiny_model)
    store = build(store_class, ckpt, 0.0)
    for layer, asked in [(2, [5, 0]), (2, [7, 5]), (9, [3, 1]), (2, [0, 7])]:
        got = store.fetch(layer, asked)
        assert [(e.layer, e.expert) for e in got] == [(layer, e) for e in asked]
        assert_own_bytes(ckpt, got)
    assert store.stats()["expert_requests"] == 8
    store.close()


def test_lru_counts_true_hits_and_evicts_least_recently_used(tiny_model):
    ckpt = open_checkpoint(tiny_model)
    store = build(LRUStore, ckpt, 0.0)  # the floor: one token's top-k = 2 slots
    assert store.slots == 2
    store.fetch(1, [0, 1])
    store.fetch(1, [1, 2])  # 1 hits; 0 is evicted for 2
    assert (store.hits, store.keeper.evictions) == (1, 1)
    store.fetch(1, [0, 2])  # 2 hits; 0 comes back in place of 1
    assert (store.hits, store.keeper.evictions) == (2, 2)
    bytes_before = store.reader.bytes_read
    assert_own_bytes(ckpt, store.fetch(1, [2, 0]))  # both resident: nothing read
    assert store.reader.bytes_read == bytes_before and store.hits == 4


def test_lru_policy_replays_the_store_decisions(tiny_model):
    ckpt = open_checkpoint(tiny_model)
    store = build(LRUStore, ckpt, 3 * 0.0001)
    policy = LRUPolicy(store.slots)
    requests = [(L, e) for L, e in np.random.default_rng(0).integers([1, 0], [13, 8], size=(60, 2)).tolist()]
    hits = 0
    for layer, e in requests:
        store.fetch(layer, [e])
        hits += policy.access((layer, e))[0]
    assert hits == store.hits and 0 < hits < len(requests)


@pytest.mark.parametrize("store_class", [DirectStore, LRUStore])
def test_a_short_read_is_unsound_and_claims_no_slot(tiny_model, tmp_path, store_class):
    model = shutil.copytree(tiny_model, tmp_path / "m")
    ckpt = open_checkpoint(model)
    store = build(store_class, ckpt, 1.0)
    last = ckpt.config.num_experts - 1
    tail = ckpt.index[expert_prefix(3, last) + "w3.weight_scale"]
    with open(tail.file, "r+b") as f:  # the shard shrinks after it was indexed
        f.truncate(tail.offset + 1)
    with pytest.raises(UnsoundRunError, match="short read.*unsound"):
        store.fetch(3, [0, last])
    if store_class is LRUStore:
        assert (3, last) not in store._slot_of and (3, 0) not in store._slot_of
        assert len(store._free) == store.slots
    store.close()
