"""The door for trained draft heads (issue 40, item 5): a draft source that lists `hidden_layers` is handed the
model's hidden states after those layers, for every position a pass forwards (prompt chunks and verify passes, alone
and in a batch), with the bits a plain teacher-forced forward gives; a source that lists none costs nothing (the sum
is never made); the ids are serial decoding's either way."""
from __future__ import annotations

import pytest

from k3core import BatchGenerator, EngineConfig, Sampler, SamplingParams, Speculation, open_engine
from k3core.errors import PluginError
from k3core.model import attnres
from k3core.model.observer import Observer
from k3core.plugin_api import DraftSource
from k3core.plugins.drafts import NgramDraft
from k3core.testing.engines import generation

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]


class Head(DraftSource):
    """Reads layers 0 and the last; proposes from a fixed list (half of it wrong), recording each position's rows."""

    name = "head"

    def __init__(self, ids, layers):
        super().__init__(None)
        self.ids, self.seen = list(ids), {}
        self.hidden_layers = layers

    def see_hidden(self, layer, position, rows):
        for i, row in enumerate(rows):
            self.seen[(layer, position + i)] = row.tobytes()  # a later pass at a position overwrites a rejected one

    def propose(self, history, generated, k):
        return self.ids[generated:generated + k]


class Collect(Observer):
    """One pass of a fresh state: row i is position i (the spans are not read: they are what is checked)."""

    def __init__(self, layers):
        self.hidden_layers, self.rows = layers, {}

    def on_hidden(self, layer, hidden, spans):
        for i, row in enumerate(hidden):
            self.rows[(layer, i)] = row.tobytes()


@pytest.fixture(scope="module")
def engine(small_model):
    with open_engine(EngineConfig(small_model, speculate=4, sequences=2, max_context=64, prefill_chunk=4),
                     available=1 << 40) as e:
        yield e


def teacher_forced(engine, ids, layers):
    seen = Collect(layers)
    engine.forward(ids, engine.new_state(), observers=[seen])
    return seen.rows


def test_a_head_sees_the_hidden_states_of_every_kept_position_with_the_teacher_forced_bits(engine):
    layers = (0, engine.config.num_hidden_layers - 1)
    want = generation(engine, PROMPT, 16, SamplingParams())
    drafts = [t if i % 3 else (t + 1) % engine.config.vocab_size for i, t in enumerate(want[0])]
    head = Head(drafts, layers)
    got = generation(engine, PROMPT, 16, SamplingParams(), Speculation(head, 4))
    assert got == want
    history = PROMPT + want[0]
    forced = teacher_forced(engine, history[:-1], layers)  # the state holds all but the last id
    assert set(forced) <= set(head.seen)
    assert all(head.seen[key] == row for key, row in forced.items())


def test_each_sequence_of_a_batch_sees_its_own_rows(engine):
    layers = (1,)
    prompts = [PROMPT, [7, 7, 8, 7, 7, 8, 2]]
    solo = [generation(engine, p, 10, SamplingParams()) for p in prompts]
    heads = [Head(solo[0][0], layers), Head([0] * 16, layers)]
    batch, states = BatchGenerator(engine), [engine.new_state() for _ in prompts]
    handles = [batch.add(p, st, Sampler(), Speculation(h, 3)) for p, st, h in zip(prompts, states, heads)]
    counts = dict.fromkeys(handles, 0)
    while len(batch):
        for e in batch.step():
            counts[e.handle] += 1
            if counts[e.handle] == 10 and e.handle in batch.sequences:
                batch.remove(e.handle, used=None)
    for p, s, h in zip(prompts, solo, heads):
        forced = teacher_forced(engine, (p + s[0])[:-1], layers)
        assert all(h.seen[key] == row for key, row in forced.items())


def test_no_hidden_state_is_summed_when_no_source_asks(engine, monkeypatch):
    want = generation(engine, PROMPT, 8, SamplingParams())

    def refuse(self):
        raise AssertionError("a hidden state was summed though no source asked for one")

    monkeypatch.setattr(attnres.Residual, "plain_sum", refuse)
    assert generation(engine, PROMPT, 8, SamplingParams(), Speculation(NgramDraft(), 4)) == want


def test_a_head_asking_for_a_layer_the_model_lacks_is_named(engine):
    with pytest.raises(PluginError, match="hidden_layers \\[99\\] are not layers of this model"):
        generation(engine, PROMPT, 4, SamplingParams(), Speculation(Head([], (99,)), 4))


def test_a_head_shares_the_model_s_embedding_and_output_head(engine, monkeypatch):
    """DraftTarget.embed and head_logits are the model's own: the rows entering the final norm (the output AttnRes
    mix) through head_logits give a forward's logits bytes."""
    target, mixes = engine.draft_target(), []
    mix = attnres.Residual.mix
    monkeypatch.setattr(attnres.Residual, "mix", lambda self, *a: mixes.append(mix(self, *a)) or mixes[-1])
    want = engine.forward(PROMPT, engine.new_state(), all_logits=True)
    assert target.head_logits(mixes[-1]).tobytes() == want.tobytes()
    assert target.embed(PROMPT).tobytes() == engine.placer.embed_rows(PROMPT).tobytes()
    with pytest.raises(Exception, match="head_logits takes float32"):
        target.head_logits(mixes[-1][:, :3])
