"""Conformance checks of an expert store class: the right bytes for every request pattern (so a stale
slot is caught), a short read raised and never cached, a capacity it can serve, honest counters and
a policy that replays its decisions and counts its evictions, and ids and logit bytes identical to
the built-in `lru` store on generated models at several budgets."""
from __future__ import annotations

import shutil
from functools import partial

import numpy as np

from ..errors import UnsoundRunError
from ..hookspecs import hookimpl
from ..interfaces import Budget, PluginContext
from ..format.checkpoint import EXPERT_PARTS, expert_prefix, open_checkpoint
from . import models
from .checks import Check, CheckFailed, expect
from .engines import greedy_run

FIELDS = ("w1_packed", "w1_scale", "w2_packed", "w2_scale", "w3_packed", "w3_scale")
BUDGETS = (0.0, 0.0002, 1.0)  # GB: the floor (one token's top-k), a few slots, every expert of the model
STATS_TYPES = {"expert_requests": int, "expert_hits": int, "expert_evictions": int, "expert_bytes_read": int,
               "expert_read_seconds": (int, float), "expert_slots": int, "expert_slot_bytes": int}


def offering(cls):
    """An in-process plugin that offers `cls` through k3_expert_stores."""
    class Offer:
        @hookimpl
        def k3_expert_stores(self):
            return [cls]
    return Offer()


def build(cls, checkpoint, cache_gb: float, options=None):
    return cls(PluginContext(checkpoint, Budget(cache_gb=cache_gb), cls.Options.build(options, f"store {cls.name!r}")))


def request_patterns(config, capacity: int, seed: int = 0):
    """(layer, experts) fetches: hand-picked repeats and orders, then a random walk over layers and
    sizes up to what one fetch may ask, so any cache evicts and refills."""
    moe = list(range(config.first_k_dense_replace, config.num_hidden_layers))
    E, most = config.num_experts, max(1, min(capacity, config.num_experts))
    a, b = moe[0], moe[-1]
    fixed = [(a, [min(5, E - 1), 0]), (a, [E - 1, min(5, E - 1)]), (b, [min(3, E - 1), 1 % E]),
             (a, [0, E - 1]), (a, [0]), (b, list(range(most)))]
    r = np.random.default_rng(seed)
    walk = [(int(r.choice(moe)), sorted(int(e) for e in r.choice(E, size=int(r.integers(1, most + 1)), replace=False)))
            for _ in range(150)]
    return [(L, sorted(set(es), key=es.index)) for L, es in fixed + walk]


def own_bytes(checkpoint, got, layer, asked, where: str) -> None:
    ids = [(e.layer, e.expert) for e in got]
    if ids != [(layer, e) for e in asked]:
        raise CheckFailed(f"{where}: asked layer {layer} experts {asked}, got {ids}")
    for e in got:
        for part, field in zip(EXPERT_PARTS, FIELDS):
            want = checkpoint.index.read(expert_prefix(e.layer, e.expert) + part)
            have = getattr(e, field)
            if have.shape != want.shape or not np.array_equal(have, want):
                raise CheckFailed(f"{where}: expert {e.expert} of layer {e.layer}: {field} is not that expert's "
                                  "bytes (a stale or shared slot?)")


def serves_own_bytes(cls, options) -> None:
    ckpt = open_checkpoint(models.model("tiny"))
    try:
        for gb in BUDGETS:
            store = build(cls, ckpt, gb, options)
            try:
                for i, (layer, asked) in enumerate(request_patterns(ckpt.config, store.capacity())):
                    got = store.fetch(layer, asked)
                    own_bytes(ckpt, got, layer, asked, f"cache {gb:g} GB, fetch {i}")
            finally:
                store.close()
    finally:
        ckpt.close()



def short_read_is_unsound(cls, options) -> None:
    for gb in (1.0, 0.0):  # every expert cached; the floor, where a store may take prefetch hints
        model = shutil.copytree(models.model("tiny"), models.scratch(f"store-{cls.name}") / f"m{gb:g}")
        ckpt = open_checkpoint(model)
        try:
            store = build(cls, ckpt, gb, options)
            try:
                c = ckpt.config
                layer, last = c.num_hidden_layers - 1, c.num_experts - 1
                tail = ckpt.index[expert_prefix(layer, last) + EXPERT_PARTS[-1]]
                with open(tail.file, "r+b") as f:  # the shard shrinks after it was indexed
                    f.truncate(tail.offset + 1)
                if store.prefetch_capacity():
                    store.prefetch(layer, [last])  # the hinted read fails too: the fetch must not hide it
                try:
                    got = store.fetch(layer, [last])
                except UnsoundRunError:
                    pass
                else:
                    raise CheckFailed(f"cache {gb:g} GB: a fetch from a shard cut short returned {len(got)} "
                                      "expert(s) instead of raising UnsoundRunError")
                # the bytes come back (same file, same inode): the store must read them, not keep junk
                shutil.copyfile(models.model("tiny") / tail.file.name, tail.file)
                own_bytes(ckpt, store.fetch(layer, [last]), layer, [last],
                          f"cache {gb:g} GB, after a failed read of the same expert")
            finally:
                store.close()
        finally:
            ckpt.close()



def capacity_serves_a_whole_fetch(cls, options) -> None:
    ckpt = open_checkpoint(models.model("small"))
    try:
        c = ckpt.config
        for gb in (0.0, 1.0):
            store = build(cls, ckpt, gb, options)
            try:
                cap = store.capacity()
                expect(isinstance(cap, int) and cap >= c.num_experts_per_token,
                       f"capacity() is {cap!r}: it must be an int >= the router's top-k ({c.num_experts_per_token})")
                layer, asked = c.num_hidden_layers - 1, list(range(min(cap, c.num_experts)))[::-1]
                own_bytes(ckpt, store.fetch(layer, asked), layer, asked, f"one fetch of {len(asked)} experts")
            finally:
                store.close()
    finally:
        ckpt.close()



def plan_rows_are_sound(cls, options) -> None:
    ckpt = open_checkpoint(models.model("tiny"))
    try:
        ctx = PluginContext(ckpt, Budget(cache_gb=0.0002), cls.Options.build(options, f"expert store {cls.name!r}"))
        rows = cls.plan(ctx)
        expect(isinstance(rows, list) and all(len(r) == 3 and isinstance(r[0], str) and isinstance(r[1], int)
                                              and r[1] >= 0 and isinstance(r[2], str) for r in rows),
               f"plan() must return (item, bytes >= 0, detail) rows, got {rows!r}")
    finally:
        ckpt.close()



def counters_are_honest(cls, options) -> None:
    ckpt = open_checkpoint(models.model("tiny"))
    try:
        store = build(cls, ckpt, 0.0002, options)
        try:
            requests = request_patterns(ckpt.config, 1, seed=1)[6:]  # single-expert fetches
            for layer, asked in requests:
                store.fetch(layer, asked)
            s = store.stats()
            wrong = [f"{k} ({s.get(k)!r})" for k, kind in STATS_TYPES.items()
                     if not isinstance(s.get(k), kind) or isinstance(s.get(k), bool) or s.get(k) < 0]
            expect(not wrong, f"stats() lacks or mistypes {', '.join(wrong)} (see plugin_api.STORE_STATS)")
            n = sum(len(a) for _, a in requests)
            expect(s["expert_requests"] == n, f"expert_requests is {s['expert_requests']}, {n} were asked for")
            expect(s["expert_hits"] <= n, f"expert_hits {s['expert_hits']} > requests {n}")
            slots = s["expert_slots"]
            policy = cls.cache_policy(slots, store.options)
            if policy is not None:
                answers = [policy.access((L, e)) for L, asked in requests for e in asked]
                hits, left = sum(bool(hit) for hit, _ in answers), sum(out is not None for _, out in answers)
                expect(hits == s["expert_hits"], f"cache_policy({slots}) replays the same requests "
                       f"with {hits} hits, the store counted {s['expert_hits']}: `k3 sim-cache` would report "
                       "another store")
                # every miss is admitted, so once the slots are full each miss evicts exactly one key
                must = max(0, n - hits - slots)
                counted = getattr(policy, "evictions", None)
                expect(left == must, f"cache_policy({slots}) evicted {left} keys on {n - hits} misses into {slots} "
                       f"slots: every miss becomes resident and evicts one key once the slots are full ({must})")
                expect(counted == must, f"cache_policy({slots}).evictions is {counted!r} after a replay that evicted "
                       f"{must} keys: count each eviction (self.evictions += 1 in access, CachePolicy) — the run "
                       "report's retention and `k3 sim-cache` read it")
                expect(s["expert_evictions"] == must, f"stats() expert_evictions is {s['expert_evictions']}, its "
                       f"cache_policy evicted {must} keys on the same requests")
        finally:
            store.close()
    finally:
        ckpt.close()



def held_experts_read_nothing(cls, options) -> None:
    """held(layer) names distinct experts of the layer, and fetching them (as many as a fetch may ask) reads nothing:
    a cache-only draft model routes to them believing they are free."""
    ckpt = open_checkpoint(models.model("tiny"))
    try:
        store = build(cls, ckpt, 0.0002, options)
        try:
            requests = request_patterns(ckpt.config, store.capacity(), seed=2)
            for layer, asked in requests:
                store.fetch(layer, asked)
            experts = ckpt.config.num_experts
            for layer in sorted({L for L, _ in requests}):
                held = list(store.held(layer))
                expect(len(set(held)) == len(held) and all(isinstance(e, int) and 0 <= e < experts for e in held),
                       f"held({layer}) returned {held[:8]!r}: not distinct expert ids of the layer (0..{experts - 1})")
                before = store.stats()["expert_bytes_read"]
                store.fetch(layer, held[:store.capacity()])
                expect(store.stats()["expert_bytes_read"] == before, f"fetching held({layer}) = {held[:8]!r} read "
                       f"{store.stats()['expert_bytes_read'] - before} bytes: held() must name only experts in RAM")
        finally:
            store.close()
    finally:
        ckpt.close()


def prefetch_is_only_a_hint(cls, options) -> None:
    ckpt = open_checkpoint(models.model("tiny"))
    try:
        for gb in BUDGETS:
            hinted, plain = build(cls, ckpt, gb, options), build(cls, ckpt, gb, options)
            try:
                room = hinted.prefetch_capacity()
                r = np.random.default_rng(2)
                E = ckpt.config.num_experts
                for i, (layer, asked) in enumerate(request_patterns(ckpt.config, hinted.capacity(), seed=3)):
                    if room and i % 4 != 3:  # right, half right, wrong, and (every fourth) no guess at all
                        wrong = [int(e) for e in r.permutation(E) if e not in asked]
                        guess = [asked, asked[::2] + wrong, wrong][i % 4 if i % 4 < 3 else 0]
                        hinted.prefetch(layer, list(dict.fromkeys(guess))[:room])
                    own_bytes(ckpt, hinted.fetch(layer, asked), layer, asked, f"cache {gb:g} GB, fetch {i} after "
                              "a prefetch hint")
                    plain.fetch(layer, asked)
                a, b = hinted.stats(), plain.stats()
                expect(a["expert_hits"] == b["expert_hits"], f"cache {gb:g} GB: {a['expert_hits']} TRUE hits with "
                       f"prefetch hints, {b['expert_hits']} without: a hint must not change what the cache keeps")
            finally:
                hinted.close()
                plain.close()
    finally:
        ckpt.close()



def batches_cover_every_expert(cls, options) -> None:
    ckpt = open_checkpoint(models.model("small"))
    try:
        c = ckpt.config
        for gb in BUDGETS:
            store = build(cls, ckpt, gb, options)
            try:
                cap = store.capacity()
                for i, layer in enumerate(range(c.first_k_dense_replace, c.num_hidden_layers)):
                    asked = [int(e) for e in np.random.default_rng(i).permutation(c.num_experts)]
                    if store.prefetch_capacity():
                        store.prefetch(layer, asked[-1:])  # a staged read the batches must account for
                    served, batches, stop = [], store.fetch_batches(layer, asked), i % 2 == 1
                    for j, batch in enumerate(batches):  # each batch checked while it is the current one
                        where = f"cache {gb:g} GB, layer {layer}, batch {j} of fetch_batches({len(asked)} experts)"
                        expect(len(batch) <= cap, f"{where}: {len(batch)} experts, capacity() is {cap}")
                        own_bytes(ckpt, batch, layer, [e.expert for e in batch], where)
                        served += [e.expert for e in batch]
                        if stop:  # every other layer the caller stops after the first batch
                            batches.close()
                            break
                    if not stop:
                        expect(sorted(served) == sorted(asked), f"cache {gb:g} GB, layer {layer}: fetch_batches "
                               f"served {sorted(served)}, asked {sorted(asked)} (each exactly once)")
                    own_bytes(ckpt, store.fetch(layer, asked[:cap]), layer, asked[:cap],
                              f"cache {gb:g} GB, a fetch after fetch_batches")
            finally:
                store.close()
    finally:
        ckpt.close()


def same_ids_as_lru(cls, options) -> None:
    for shape in ("tiny", "small"):
        for gb in BUDGETS:
            want = greedy_run(models.model(shape), expert_store="lru", cache_gb=gb)
            got = greedy_run(models.model(shape), plugins=[offering(cls)], expert_store=cls.name, cache_gb=gb,
                             store_options=options)
            expect(got[0] == want[0], f"{shape} model, cache {gb:g} GB: ids {got[0]} instead of the lru store's "
                   f"{want[0]}")
            expect(got[1] == want[1], f"{shape} model, cache {gb:g} GB: the logit bytes differ from the lru store's")


def store_checks(cls, options=None) -> list[Check]:
    """Every check of expert store class `cls` (with its `options`, a mapping or cls.Options)."""
    who = f"expert store {cls.name!r}"
    return [Check(f"{who}: serves each expert's own bytes, in the order asked, for every request pattern",
                  partial(serves_own_bytes, cls, options)),
            Check(f"{who}: a short read raises UnsoundRunError and is never served later",
                  partial(short_read_is_unsound, cls, options)),
            Check(f"{who}: capacity() covers top-k and a fetch of that many is served",
                  partial(capacity_serves_a_whole_fetch, cls, options)),
            Check(f"{who}: plan() returns memory-plan rows", partial(plan_rows_are_sound, cls, options)),
            Check(f"{who}: stats() has the STORE_STATS counters and its cache_policy replays its hits and counts "
                  "its evictions",
                  partial(counters_are_honest, cls, options)),
            Check(f"{who}: held(layer) names only experts a fetch serves without reading (what a cache-only draft "
                  "routes to)", partial(held_experts_read_nothing, cls, options)),
            Check(f"{who}: prefetch hints (right, partly right, wrong) change neither the bytes served nor the hits",
                  partial(prefetch_is_only_a_hint, cls, options)),
            Check(f"{who}: fetch_batches serves every expert of a layer once, in batches of at most capacity(), "
                  "and a batch abandoned early leaves the store sound",
                  partial(batches_cover_every_expert, cls, options)),
            Check(f"{who}: ids and logit bytes identical to the lru store at cache 0, 0.0002 and 1 GB",
                  partial(same_ids_as_lru, cls, options))]
