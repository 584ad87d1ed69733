"""Exact speculative decoding: with any draft source — lookup (ngram, suffix), an oracle replaying the serial
continuation, one that is always wrong, random ids — at K = 1..8 and adaptive, the ids, the logit bytes
of every emitted position and the decode state left behind are those of serial decoding; stops land
where serial decoding stops, and a conversation continues after rejected drafts exactly as without them.
"""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from k3core import (BatchGenerator, ChatSession, Conversation, EngineConfig, Sampler, SamplingParams, Session,
                    Speculation, load_tokenizer, open_engine)
from k3core.generation.generate import AUTO_K
from k3core.errors import InputError, K3Error, PluginError, UsageError
from k3core.plugin_api import DraftSource
from k3core.plugins.drafts import NgramDraft, ReplayDraft
from k3core.model.pass_cost import PassCost
from k3core.plugins.suffix import SuffixDraft
from k3core.testing.engines import generation, state_bytes

from ..conftest import DEMO_MODEL

STEPS = 20
GREEDY = SamplingParams()
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=11)
PROMPTS = {"tiny": [3, 1, 4, 1, 5, 9, 2, 6], "small": [7, 7, 8, 7, 7, 8, 7, 7, 8], "demo": None}


class Listed(DraftSource):
    """Proposes from a fixed list: the i-th id after the i-th generated (like replay:PATH, without a file)."""

    name = "listed"

    def __init__(self, ids):
        super().__init__(None)
        self.ids = list(ids)

    def propose(self, history, generated, k):
        return self.ids[generated:generated + k]


class Random(DraftSource):
    """Random ids, and a random number of them (0..k), from a seeded generator."""

    name = "random"

    def __init__(self, seed, vocab):
        super().__init__(None)
        self.rng, self.vocab = random.Random(seed), vocab

    def propose(self, history, generated, k):
        return [self.rng.randrange(self.vocab) for _ in range(self.rng.randint(0, k))]


@pytest.fixture(scope="module", params=["tiny", "small", "demo"])
def case(request, model_factory):
    """(engine, prompt) on two generated shapes and the trained demo model, with rollback for AUTO_K."""
    model = DEMO_MODEL if request.param == "demo" else model_factory(request.param)
    with open_engine(EngineConfig(model, speculate=AUTO_K)) as engine:
        prompt = PROMPTS[request.param]
        if prompt is None:
            conv = Conversation(load_tokenizer(DEMO_MODEL), "instruct")
            conv.add_user("Repeat after me: red, green, blue, red, green, blue.")
            prompt = conv.prompt()
        yield engine, prompt


def sources(serial_ids, vocab):
    """(name, fresh Speculation) for every draft pattern the contract covers."""
    wrong = [(t + 1) % vocab for t in serial_ids]
    out = [(f"oracle K={k}", lambda k=k: Speculation(Listed(serial_ids), k)) for k in range(1, 9)]
    out += [("wrong K=4", lambda: Speculation(Listed(wrong), 4)),
            ("half right K=3", lambda: Speculation(Listed([t if i % 2 else w for i, (t, w) in
                                                           enumerate(zip(serial_ids, wrong))]), 3)),
            ("random K=5", lambda: Speculation(Random(3, vocab), 5)),
            ("ngram K=4", lambda: Speculation(NgramDraft(), 4)),
            ("oracle auto", lambda: Speculation(Listed(serial_ids), AUTO_K, adaptive=True)),
            ("wrong auto", lambda: Speculation(Listed(wrong), AUTO_K, adaptive=True)),
            ("ngram auto", lambda: Speculation(NgramDraft(), AUTO_K, adaptive=True)),
            ("suffix K=4", lambda: Speculation(SuffixDraft(), 4)),
            ("suffix auto", lambda: Speculation(SuffixDraft(), AUTO_K, adaptive=True))]
    return out


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_every_draft_pattern_gives_the_serial_ids_logits_and_state(case, params):
    engine, prompt = case
    want = generation(engine, prompt, STEPS, params)
    for name, spec in sources(want[0] + want[0][:8], engine.config.vocab_size):
        got = generation(engine, prompt, STEPS, params, spec())
        assert got[0] == want[0], name
        assert got[1] == want[1], f"{name}: logit bytes"
        assert got[2] == want[2], f"{name}: decode state after stopping"


def test_a_replay_file_drives_the_oracle_and_the_wrong_draft(case, tmp_path):
    engine, prompt = case
    want = generation(engine, prompt, STEPS, GREEDY)
    (tmp_path / "oracle.txt").write_text(", ".join(map(str, want[0])))
    (tmp_path / "wrong.txt").write_text(" ".join(str((t + 3) % engine.config.vocab_size) for t in want[0]))
    for name in ("oracle", "wrong"):
        draft = ReplayDraft(str(tmp_path / f"{name}.txt"))
        assert generation(engine, prompt, STEPS, GREEDY, Speculation(draft, 4)) == want, name


def passes(engine, prompt, steps, spec):
    before = engine.forward_passes
    generation(engine, prompt, steps, GREEDY, spec)
    return engine.forward_passes - before


def test_pass_counts_follow_acceptance(tiny_model):
    with open_engine(EngineConfig(tiny_model, speculate=AUTO_K)) as engine:
        prompt = PROMPTS["tiny"]
        ids = generation(engine, prompt, 64, GREEDY)[0]
        serial = passes(engine, prompt, 24, None)
        assert serial == 24  # the prompt pass gives id 1, one pass per id after it
        for k in (1, 2, 4, 8):  # a full accept emits k + 1 ids per pass
            assert passes(engine, prompt, 24, Speculation(Listed(ids), k)) == 1 + math.ceil(23 / (k + 1))
        wrong = [(t + 1) % engine.config.vocab_size for t in ids]
        assert passes(engine, prompt, 24, Speculation(Listed(wrong), 4)) == serial  # nothing saved, nothing lost
        tally = []

        class Count(DraftSource):
            name = "count"

            def propose(self, history, generated, k):
                tally.append(k)
                return wrong[generated:generated + k]

        generation(engine, prompt, 64, GREEDY, Speculation(Count(), AUTO_K, adaptive=True))
        cost = PassCost.of(engine)  # auto weighs drafts in weight bytes: useless ones cost at most 3 % more than none
        wasted = sum(cost.bytes(1 + k) - cost.bytes(1) for k in tally)
        assert wasted <= 0.03 * 64 * cost.bytes(1), f"auto kept drafting useless ids: {tally}"
        assert passes(engine, prompt, 24, Speculation(Listed(ids), AUTO_K, adaptive=True)) <= 8


def test_auto_drafts_what_the_bytes_pay_for():
    """DraftLength on a pass cost like K3's at 8 GB (trunk 72 GB once, 26 GB of experts per row, unions as the
    real trace's): one id on the prior (1 in 4 accepted pays for a second row, 1.17x the bytes), none once that
    fails, resting long enough that such tries cost 2 % of the passes; K = 8 once every draft is right; 1 or 0
    at a coin's odds."""
    from k3core.generation.generate import DraftLength

    class K3AtTheFloor:
        union = {1: 1.0, 2: 1.66, 3: 2.2, 4: 2.76, 5: 3.25, 6: 3.8, 7: 4.3, 8: 4.75, 9: 5.18}

        def bytes(self, rows):
            return 72e9 + 26e9 * self.union[rows]

    length = DraftLength(8, True, K3AtTheFloor())
    assert length.best() == 1 and length.next() == 1
    length.update(1, 0)
    assert [length.next() for _ in range(10)] == [0] * 9 + [1]  # a try costs 17.5 % of a pass: 9 steps' rest
    for _ in range(30):
        length.update(8, 8)
    assert length.best() == 8
    half = DraftLength(8, True, K3AtTheFloor())
    for _ in range(40):  # every other draft right: the second draft pays only as often as a coin
        half.update(8, 1)
        half.update(8, 0)
    assert half.best() in (0, 1)
    first = DraftLength(8, True, K3AtTheFloor())
    for _ in range(20):  # every one-id draft right, no longer one tried yet: position 2 is presumed as good as 1
        first.update(1, 1)
    assert first.best() == 8  # (a prior of 1 in 4 at each untried position kept it at 2)


@pytest.mark.parametrize("shape", ["tiny", "small"])
def test_rollback_gives_the_state_of_forwarding_only_the_kept_ids(model_factory, shape):
    with open_engine(EngineConfig(model_factory(shape), speculate=8)) as engine:
        prompt, more = [5, 6, 7, 8], [9, 10, 11, 12, 13, 14]
        for kept in range(len(more) + 1):
            state = engine.new_state()
            engine.forward(prompt, state)
            engine.mark(state)
            engine.forward(more, state, all_logits=True)
            engine.rollback(state, kept)
            alone = engine.new_state()
            engine.forward(prompt, alone)
            if kept:
                engine.forward(more[:kept], alone)
            assert state_bytes(engine, state) == state_bytes(engine, alone), f"kept {kept}"
            assert state.mark is None
            # and the two states go on to the same logits
            assert engine.forward([1, 2], state).tobytes() == engine.forward([1, 2], alone).tobytes()


def test_rollback_needs_a_mark_and_a_count_in_range(tiny_model):
    with open_engine(EngineConfig(tiny_model, speculate=2)) as engine:
        state = engine.new_state()
        engine.forward([1, 2], state)
        with pytest.raises(K3Error, match="without a mark"):
            engine.rollback(state, 0)
        engine.mark(state)
        engine.forward([3], state)
        with pytest.raises(K3Error, match="rollback to 2 of the 1 positions"):
            engine.rollback(state, 2)


def events_of(session, prompt, params, spec):
    events = list(session.generate(prompt, params, speculation=spec))
    done = events[-1]
    return [(e.kind, e.text, e.channel) for e in events[:-1]], done.ids, done.reason


@pytest.fixture(scope="module")
def demo():
    with open_engine(EngineConfig(DEMO_MODEL, speculate=AUTO_K)) as engine:
        yield engine, load_tokenizer(DEMO_MODEL)


def test_stop_ids_strings_and_max_tokens_land_where_serial_stops(demo):
    engine, tok = demo
    prompt = tok.encode("The capital of France is Paris. The capital of Japan is Tokyo. The capital of")
    full = generation(engine, prompt, 40, GREEDY)[0]
    words = tok.decode(full)
    stop_string = words.strip().split()[2]  # a word a few tokens in
    stop_id = full[5]
    cases = {"max tokens": SamplingParams(max_tokens=7), "stop id": SamplingParams(max_tokens=40, stop_ids=(stop_id,)),
             "stop string": SamplingParams(max_tokens=40, stop_strings=(stop_string,)),
             "seeded, max tokens": SamplingParams(temperature=1.0, seed=3, max_tokens=9)}
    for what, params in cases.items():
        serial = Session(engine, tok)
        want = events_of(serial, prompt, params, None)
        for k in (1, 4, 8):  # the oracle drafts run past the stop: the verify pass sees ids after it
            spec = Session(engine, tok)
            got = events_of(spec, prompt, params, Speculation(Listed(full + full), k))
            assert got == want, (what, k)
            assert state_bytes(engine, spec.state) == state_bytes(engine, serial.state), (what, k)
    assert want[2] == "max tokens"


def test_a_conversation_continues_after_rejected_drafts_as_without_them(demo):
    engine, tok = demo
    turns = ["What is the capital of France?", "And of Japan?", "What is 7 + 5?"]

    def converse(make_spec):
        chat, out = ChatSession(engine, tok), []
        for text in turns:
            for _ in chat.ask(text, GREEDY, speculation=make_spec()):
                pass
            out.append((chat.last["answer"], chat.last["reused_tokens"], chat.last["generated_tokens"]))
        return out, state_bytes(engine, chat.session.state), chat.last

    want, want_state, _ = converse(lambda: None)
    wrong = [1] * 64  # never what the model says: every pass rolls back
    got, got_state, last = converse(lambda: Speculation(Listed(wrong), 4))
    assert got == want and got_state == want_state
    assert last["draft_proposed"] > 0 and last["draft_accepted"] == 0
    got, got_state, _ = converse(lambda: Speculation(NgramDraft(), AUTO_K, adaptive=True))
    assert got == want and got_state == want_state


def test_the_done_event_counts_passes_and_drafts(demo):
    engine, tok = demo
    prompt = tok.encode("one two three one two three one two")
    full = generation(engine, prompt, 30, GREEDY)[0]
    events = list(Session(engine, tok).generate(prompt, SamplingParams(max_tokens=21),
                                                speculation=Speculation(Listed(full), 4)))
    s = events[-1].stats
    assert s["generated_tokens"] == 21 and s["forward_passes"] == 1 + 4  # 20 ids after the first, 5 a pass
    assert s["draft_proposed"] == 16 and s["draft_accepted"] == 16
    assert s["decode_passes"] == 4 and s["bytes_read_per_token"] == 0  # the demo model is held in RAM


class Broken(DraftSource):
    name = "broken"

    def __init__(self, result):
        super().__init__(None)
        self.result = result

    def propose(self, history, generated, k):
        return self.result


@pytest.mark.parametrize("result, problem", [([1, 2, 3, 4, 5, 6], "got 6 ids"), ([-1], "including \\[-1\\]"),
                                             ([10 ** 9], "including"), ([1.5], "including"), (7, "returned int")])
def test_a_draft_source_that_breaks_its_contract_is_named(tiny_model, result, problem):
    with open_engine(EngineConfig(tiny_model, speculate=4)) as engine:
        with pytest.raises(PluginError, match=f"draft source 'broken'.*{problem}"):
            generation(engine, [1, 2, 3], 5, GREEDY, Speculation(Broken(result), 4))


def test_speculation_beyond_the_planned_rollback_is_refused(tiny_model):
    with open_engine(EngineConfig(tiny_model, speculate=2)) as engine:
        with pytest.raises(UsageError, match="reserves rollback for 2 drafted ids"):
            generation(engine, [1, 2], 3, GREEDY, Speculation(NgramDraft(), 4))
    with open_engine(EngineConfig(tiny_model)) as engine:
        with pytest.raises(UsageError, match="reserves rollback for 0"):
            generation(engine, [1, 2], 3, GREEDY, Speculation(NgramDraft(), 1))
    for bad in (0, 17, "4", True):
        with pytest.raises(UsageError, match="speculate must be an integer in 1..16"):
            Speculation(NgramDraft(), bad)
    with pytest.raises(UsageError, match="DraftSource instance"):
        Speculation("ngram", 4)
    with pytest.raises(UsageError, match="speculate must be an integer in 0..16"):
        EngineConfig(tiny_model, speculate=-1)


def test_the_memory_plan_counts_the_rollback(tiny_model):
    from k3core import memory_plan
    from k3core.testmodel.make import shape_config
    from k3core.plugins.kda import KDA

    rows = {r.item: r for r in memory_plan(EngineConfig(tiny_model, speculate=4), available=1 << 40).rows}
    c = shape_config("tiny")
    kda_layers = [L for L in range(c.num_hidden_layers) if not c.is_mla(L)]
    per_position = 4 * (7 * c.kda_proj_dim + c.kda_num_heads)
    assert rows["speculation rollback"].bytes == len(kda_layers) * (KDA().state_bytes(c, 0, 0) + 5 * per_position)
    assert "5 positions (--speculate 4)" in rows["speculation rollback"].detail
    assert "speculation rollback" not in {r.item for r in memory_plan(EngineConfig(tiny_model), available=1 << 40).rows}
    wide = shape_config("wide")  # real K3 widths: what one verified position costs per KDA layer
    assert KDA().rollback_bytes(wide, 0, 1) - KDA().rollback_bytes(wide, 0, 0) == 344_448


def test_the_id_prompt_is_still_checked_with_speculation(tiny_model):
    with open_engine(EngineConfig(tiny_model, speculate=2, max_context=16)) as engine:
        with pytest.raises(InputError, match="over the context limit of 16"):
            generation(engine, list(range(17)), 2, GREEDY, Speculation(NgramDraft(), 2))
        ids = generation(engine, [1, 2, 3], 40, GREEDY)[0]
        assert len(ids) == 13  # the context fills: 3 + 13 = 16
        assert generation(engine, [1, 2, 3], 40, GREEDY, Speculation(Listed(ids), 2))[0] == ids
        assert np.array_equal(ids, generation(engine, [1, 2, 3], 40, GREEDY, Speculation(Listed(ids[:4]), 2))[0])


def test_batched_sequences_speculate_and_each_gets_its_serial_output(model_factory):
    """Four sequences in one BatchGenerator, three of them speculating (an oracle, an always-wrong list, random
    ids; fixed K and adaptive), joining together: each gets the serial ids, logit bytes and decode state, and
    one stopped in the middle of a verified step keeps exactly the ids it used."""
    with open_engine(EngineConfig(model_factory("small"), speculate=AUTO_K, sequences=4, max_context=64)) as engine:
        prompts = [[3, 1, 4, 1, 5], [7, 7, 8, 7, 7, 8], [9, 2, 6], [5, 3, 5]]
        params = [GREEDY, SEEDED, SamplingParams(temperature=1.0, seed=4), GREEDY]
        steps = [14, 14, 14, 6]
        solo = [generation(engine, p, n, sp) for p, n, sp in zip(prompts, steps, params)]
        oracle = Listed(solo[0][0])  # the i-th id after the i-th generated: always right
        specs = [Speculation(oracle, 4), Speculation(Listed([0] * 64), 3),
                 Speculation(Random(2, engine.config.vocab_size), AUTO_K, adaptive=True),
                 Speculation(Listed(solo[3][0]), 8)]
        batch = BatchGenerator(engine)
        states = [engine.new_state() for _ in prompts]
        handles = [batch.add(p, st, Sampler(sp), s) for p, st, sp, s in zip(prompts, states, params, specs)]
        got = {h: ([], []) for h in handles}
        steps_of_oracle = 0
        while len(batch):
            emitted = batch.step()
            steps_of_oracle += handles[0] in batch.sequences
            for h in handles:
                mine = [e for e in emitted if e.handle == h]
                for used, e in enumerate(mine, start=1):
                    ids, rows = got[h]
                    ids.append(e.token)
                    rows.append(e.logits.view("u4").tobytes())
                    if len(ids) == steps[handles.index(h)]:
                        batch.remove(h, used=used)  # maybe mid-step: the rest of this step's ids are dropped
                        break
        for i, (h, st) in enumerate(zip(handles, states)):
            ids, rows = got[h]
            assert (ids, b"".join(rows), state_bytes(engine, st)) == solo[i], f"sequence {i}"
        assert steps_of_oracle < 14 // 2  # the oracle's sequence verified several ids per pass
