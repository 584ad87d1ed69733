"""The `suffix` draft source (k3core/plugins/suffix.py): one index over every conversation the process has seen.

What it proposes (the best-supported continuation of the longest suffix seen before, as long as the match
earns), that a follow-up continues its conversation's document instead of adding it again, that memory stays
within the capacity (the least recently used documents dropped, never one being written) — and that none of it
changes an id: greedy and seeded, across chat turns, after evictions, and in a server batch of four.
"""
from __future__ import annotations

import re

import pytest

from k3core import ChatSession, EngineConfig, SamplingParams, Speculation, load_tokenizer, open_engine
from k3core.generation.generate import AUTO_K
from k3core.plugins.suffix import BYTES_PER_ID, DEFAULT_BYTES, MATCH_SCALE, SuffixDraft, SuffixIndex
from k3core.testing.engines import generation

from ...conftest import DEMO_MODEL

SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=11)


def written(index: SuffixIndex, *documents) -> None:
    for ids in documents:
        doc = index.open(ids)
        index.close(doc)


def test_it_proposes_the_continuation_seen_most_often():
    index = SuffixIndex(10_000)
    written(index, [1, 2, 3, 4, 5, 6], [9, 2, 3, 4, 7, 8], [8, 2, 3, 4, 7, 8])
    doc = index.open([5, 5, 2, 3, 4])
    assert index.propose(doc, 8) == [7, 8]  # [2, 3, 4] went on to 7, 8 twice and to 5, 6 once


def test_a_longer_match_earns_a_longer_proposal():
    index = SuffixIndex(10_000)
    written(index, list(range(100, 140)))
    short, long_ = index.open([7, 100, 101]), index.open([7, 100, 101, 102, 103, 104, 105])
    assert index.propose(short, 16) == list(range(102, 102 + int(MATCH_SCALE * 2)))
    assert index.propose(long_, 16) == list(range(106, 106 + 12))
    assert index.propose(index.open([8, 100]), 16) == []  # a one-id match proposes nothing


def test_the_current_document_is_looked_up_too():
    index = SuffixIndex(10_000)
    doc = index.open([5, 6, 7, 8, 9, 1, 2, 5, 6, 7])
    assert index.propose(doc, 2) == [8, 9]


def test_a_follow_up_continues_its_document_and_adds_only_its_new_ids():
    index = SuffixIndex(10_000)
    first = index.open([1, 2, 3])
    index.extend(first, [1, 2, 3, 4, 5])
    index.close(first)
    second = index.open([1, 2, 3, 4, 5, 6, 7])
    assert second is first and index.held == 7 and len(index.documents) == 1
    other = index.open([1, 2, 3, 4, 5, 6, 7, 8])  # the document is being written: a new one
    assert other is not second and len(index.documents) == 2


def test_memory_stays_within_the_capacity_and_a_document_being_written_is_kept():
    index = SuffixIndex(1_000)
    live = index.open(list(range(300, 500)))
    for start in range(0, 5_000, 100):
        written(index, list(range(start, start + 100)))
        assert index.held <= index.capacity
    assert live in index.documents.values() and index.held == sum(len(d.tokens) for d in index.documents.values())
    assert index.propose(live, 4) == []  # [.., 498, 499] was seen nowhere else
    index.extend(live, [*range(300, 500), 300, 301, 302])
    assert index.propose(live, 4) == [303, 304, 305, 306]  # rebuilt: its own ids still answer


def test_the_draft_source_ends_its_document_with_what_the_generation_kept():
    index = SuffixIndex.shared()
    draft = SuffixDraft()
    draft.begin((41, 42, 43))
    draft.propose((41, 42, 43, 44), 1, 4)
    draft.end((41, 42, 43, 44, 45))
    doc = next(d for d in index.documents.values() if d.tokens[:3] == [41, 42, 43])
    assert doc.tokens == [41, 42, 43, 44, 45] and not doc.active


@pytest.fixture(scope="module", params=["tiny", "small", "demo"])
def engine(request, model_factory):
    model = DEMO_MODEL if request.param == "demo" else model_factory(request.param)
    with open_engine(EngineConfig(model, speculate=AUTO_K)) as e:
        yield e


@pytest.mark.parametrize("params", [SamplingParams(), SEEDED], ids=["greedy", "seeded"])
def test_the_same_ids_logits_and_state_as_serial_before_and_after_evictions(engine, params):
    prompt = [7, 7, 8, 7, 7, 8, 7, 7, 8]
    want = generation(engine, prompt, 24, params)
    spec = lambda: Speculation(SuffixDraft(), AUTO_K, adaptive=True)  # noqa: E731
    assert generation(engine, prompt, 24, params, spec()) == want
    assert generation(engine, prompt, 24, params, spec()) == want  # now the first run's reply is in the index
    SuffixIndex.shared().resize(40)  # every later id evicts
    try:
        for _ in range(2):
            assert generation(engine, prompt, 24, params, spec()) == want
    finally:
        SuffixIndex.shared().resize(DEFAULT_BYTES // BYTES_PER_ID)


def test_chat_turns_reuse_earlier_replies_and_keep_the_serial_ids():
    """A demo-model chat asked the same question in three conversations: with suffix drafts the replies are the
    serial ones, and later conversations take fewer passes (their answers were seen)."""
    tokenizer = load_tokenizer(DEMO_MODEL)
    with open_engine(EngineConfig(DEMO_MODEL, speculate=AUTO_K)) as engine:
        questions = ["What is the capital of France?", "What is 2 + 3?"]
        serial = ChatSession(engine, tokenizer)
        want = [_reply(serial, q, None) for q in questions]
        passes = []
        for _ in range(3):
            chat = ChatSession(engine, tokenizer)
            got = [_reply(chat, q, Speculation(SuffixDraft(), AUTO_K, adaptive=True)) for q in questions]
            assert [ids for ids, _ in got] == [ids for ids, _ in want]
            passes.append(sum(p for _, p in got))
        assert passes[-1] < sum(p for _, p in want)


def _reply(chat, question, speculation):
    done = [e for e in chat.ask(question, SamplingParams(max_tokens=40), speculation=speculation)][-1]
    return done.ids, done.stats["decode_passes"]


def test_a_server_batch_of_four_sharing_history_replies_as_a_plain_server(model_factory):
    from ...serve.conftest import Live, chat_together

    history = [{"role": "user", "content": "one two three one two three"},
               {"role": "assistant", "content": "one two three"}]
    asks = [history + [{"role": "user", "content": f"again {n}"}] for n in range(4)]
    ask = dict(max_tokens=24, temperature=0.9, seed=2)
    plain = Live(model_factory("small"), sequences=1)
    try:
        want = [plain.client.chat.completions.create(model=plain.name, messages=m, **ask).choices[0].message.content
                for m in asks]
    finally:
        plain.close()
    live = Live(model_factory("small"), sequences=4, speculate=AUTO_K)
    live.worker.speculation = lambda: Speculation(SuffixDraft(), AUTO_K, adaptive=True)
    try:
        for _ in range(2):  # the second round drafts from the first's replies
            assert chat_together(live, [dict(messages=m, **ask) for m in asks]) == want
    finally:
        live.close()


def test_a_document_cut_to_fit_keeps_its_place_in_the_sequence():
    index = SuffixIndex(40)
    doc = index.open(list(range(100, 150)))  # over the capacity alone: its oldest ids are cut
    assert index.held <= 40 and doc.dropped + len(doc.tokens) == 50 and doc.tokens[-1] == 149
    index.extend(doc, [*range(100, 150), 7, 8])
    assert doc.tokens[-3:] == [149, 7, 8]  # the new ids, not a misaligned slice
    index.close(doc)
    assert index.open([*range(100, 150), 7, 8, 9]) is doc and doc.tokens[-1] == 9


def test_draft_memory_is_in_the_plan_and_bounds_the_index(tiny_model, capsys):
    from k3core import memory_plan
    from k3core.cli.main import main

    rows = {r.item: r.bytes for r in memory_plan(EngineConfig(tiny_model, speculate=8, draft_memory_gb=0.25)).rows}
    assert rows["draft index"] == 250_000_000
    assert "draft index" not in {r.item for r in memory_plan(EngineConfig(tiny_model, speculate=8)).rows}
    try:
        assert main(["run", str(tiny_model), "--ids", "1,2,3", "--gen", "4", "--speculate", "auto", "--draft", "suffix",
                     "--draft-memory", "0.001"]) == 0
        assert re.search(r"draft index +1 MB", capsys.readouterr().err)
        assert SuffixIndex.shared().capacity == 1_000_000 // BYTES_PER_ID
    finally:
        SuffixIndex.shared().resize(DEFAULT_BYTES // BYTES_PER_ID)


def test_bad_draft_memory_and_arguments_are_refused_by_name(tiny_model, capsys):
    from k3core.cli.main import main
    from k3core.errors import UsageError

    with pytest.raises(UsageError, match="draft_memory_gb"):
        EngineConfig(tiny_model, draft_memory_gb=-1)
    with pytest.raises(UsageError, match="--draft suffix takes no argument"):
        SuffixDraft("64M")
    with pytest.raises(UsageError, match="at least one id"):
        SuffixIndex(0)
    with pytest.raises(SystemExit) as refused:  # argparse's refusal (the flag's type, k3core/cli/options.py number)
        main(["run", str(tiny_model), "--ids", "1,2", "--gen", "2", "--speculate", "auto", "--draft", "suffix",
              "--draft-memory", "-1"])
    assert refused.value.code == 2 and "argument --draft-memory: takes GB >= 0" in capsys.readouterr().err
