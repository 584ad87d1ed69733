"""Batched sequences: Engine.forward_batch and BatchGenerator advance several sequences in one pass, and
each gets exactly what it gets alone — ids, the logit bytes of every position and its decode state — with
prompts of different lengths, sampled and greedy, one leaving early, one cancelled, one filling its context."""
from __future__ import annotations

import pytest

from k3core import BatchGenerator, EngineConfig, Sampler, SamplingParams, open_engine
from k3core.errors import InputError, UsageError
from k3core.testing.engines import generation, state_bytes

from ..conftest import DEMO_MODEL

GREEDY = SamplingParams()


@pytest.fixture(scope="module", params=["tiny", "small", "demo"])
def engine(request, model_factory):
    model = DEMO_MODEL if request.param == "demo" else model_factory(request.param)
    with open_engine(EngineConfig(model, sequences=4, prefill_chunk=6, max_context=40)) as e:
        yield e


def test_forward_batch_gives_each_sequence_its_own_bits(engine):
    prompts = [[1, 2, 3], [9] * 11, [4], [5, 6, 7, 8, 5, 6]]
    alone = []
    for p in prompts:
        state = engine.new_state()
        alone.append((engine.forward(p, state, all_logits=True).tobytes(), state))
    for all_logits in (True, False):
        states = [engine.new_state() for _ in prompts]
        rows = engine.forward_batch(list(zip(prompts, states)), all_logits=all_logits)
        for got, state, (want, want_state), p in zip(rows, states, alone, prompts):
            want_rows = want if all_logits else want[-engine.config.vocab_size * 4:]
            assert got.tobytes() == want_rows
            assert state_bytes(engine, state) == state_bytes(engine, want_state)
    # and the states go on together as they go on alone
    rows = engine.forward_batch([([7], s) for _, s in alone[:2]])
    for row, (_, _), p in zip(rows, alone, prompts):
        state = engine.new_state()
        engine.forward(p, state)
        assert row.tobytes() == engine.forward([7], state).tobytes()


def test_sequences_that_join_leave_and_fill_the_context_get_their_solo_output(engine):
    requests = [  # (prompt, ids wanted, sampling; None: until the context is full)
        ([1, 2, 3], 12, GREEDY),
        ([7] * 13, 4, SamplingParams(temperature=0.8, seed=3)),  # a long prompt in 3 chunks, finishes early
        (list(range(20, 31)), None, SamplingParams(temperature=1.0, top_k=20, seed=11)),  # fills 40 positions
        ([200, 3], 9, GREEDY),  # cancelled after 5 ids
    ]
    cancel_after = {3: 5}
    solo = [generation(engine, p, cancel_after.get(i, n or 99), sp) for i, (p, n, sp) in enumerate(requests)]
    batch = BatchGenerator(engine)
    states = [engine.new_state() for _ in requests]
    handles = [batch.add(p, st, Sampler(sp)) for (p, _, sp), st in zip(requests, states[:3])]
    got = {h: ([], []) for h in handles}
    late = None
    while len(batch):
        for e in batch.step():
            ids, rows = got[e.handle]
            ids.append(e.token)
            rows.append(e.logits.view("u4").tobytes())
            i = handles.index(e.handle)
            if len(ids) == cancel_after.get(i, requests[i][1] or 99) and not e.last:
                batch.remove(e.handle)
        if late is None:  # the fourth joins after the first step, while the others run
            late = batch.add(requests[3][0], states[3], Sampler(requests[3][2]))
            handles.append(late)
            got[late] = ([], [])
    for i, (h, st) in enumerate(zip(handles, states)):
        ids, rows = got[h]
        assert (ids, b"".join(rows), state_bytes(engine, st)) == solo[i], f"sequence {i}"
    assert len(got[handles[2]][0]) == 40 - 11  # it ran until its context was full


def test_the_batch_limits_are_enforced_and_named(engine):
    states = [engine.new_state() for _ in range(5)]
    with pytest.raises(InputError, match="a batch of 5 sequences, over the 4"):
        engine.forward_batch([([1], s) for s in states])
    with pytest.raises(InputError, match="one decode state appears twice"):
        engine.forward_batch([([1], states[0]), ([2], states[0])])
    with pytest.raises(InputError, match="the batch is empty"):
        engine.forward_batch([])
    batch = BatchGenerator(engine)
    for s in states[:4]:
        batch.add([1, 2], s)
    with pytest.raises(UsageError, match="already holds 4 sequences"):
        batch.add([1, 2], states[4])
    batch.remove(0)
    with pytest.raises(UsageError, match="already in the batch"):
        batch.add([1, 2], states[1])
    with pytest.raises(InputError, match="over the context limit of 40"):
        batch.add(list(range(41)), states[4])


def test_one_pass_reads_each_expert_once_for_all_rows(model_factory):
    from k3core import Observer

    class Routes(Observer):
        def __init__(self):
            self.wanted = 0

        def on_route(self, layer, expert_ids):
            self.wanted += len(set(expert_ids.flat))

    with open_engine(EngineConfig(model_factory("tiny"), sequences=3, expert_store="direct")) as engine:
        routes = Routes()
        before = engine.stats()["expert_requests"]
        engine.forward_batch([([1, 2], engine.new_state()), ([3], engine.new_state()), ([4, 5, 6], engine.new_state())],
                             observers=[routes])
        assert engine.stats()["expert_requests"] - before == routes.wanted  # the union per layer, not per row


def test_per_sequence_logits_and_a_bad_used_count_are_checked(engine):
    a, b = engine.new_state(), engine.new_state()
    rows = engine.forward_batch([([1, 2, 3], a), ([4, 5], b)], all_logits=[True, False])
    assert rows[0].shape == (3, engine.config.vocab_size) and rows[1].shape == (engine.config.vocab_size,)
    with pytest.raises(InputError, match="all_logits names 1 sequences, the batch has 2"):
        engine.forward_batch([([1], engine.new_state()), ([2], engine.new_state())], all_logits=[True])
    batch = BatchGenerator(engine)
    h = batch.add([1, 2], engine.new_state())
    batch.step()
    with pytest.raises(UsageError, match="used must be 1..1"):
        batch.remove(h, used=2)
    assert len(batch) == 1 and batch.remove(h, used=1) is not None  # refused, it stayed; then it leaves