"""The chat function as a plain generator (no Gradio): replies stream and equal a fresh
ChatSession's; closing the generator stops the engine between tokens and the session stays usable;
a follow-up forwards only its new tokens; a freed decode state is recomputed exactly; undo, clear
and a refused message leave the conversation consistent."""
from __future__ import annotations

import re
import time

from k3core.generation.sampling import SamplingParams

from k3core import speculation
from k3core.generation.channels import visible
from tests.ui.conftest import GREEDY, on_each_layer, slowed, ui_args
from ui.chat import Chats
from ui.engine_panel import Monitor
from ui.host import EngineHost


def finish(gen):
    updates = list(gen)
    assert updates[-1].status in ("done", "stopped", "error"), updates[-1]
    return updates


def answer_of(update) -> str:
    """The reply as the page shows it; compared with `visible(...)` of the engine's own text."""
    return update.messages[-1]["content"]


def test_a_reply_streams_and_equals_a_fresh_chat_session(host, reference):
    chats = Chats(host, Monitor(host))
    updates = finish(chats.reply("a", "hello there", GREEDY))
    assert updates[0].status == "waiting"
    running = [u for u in updates if u.status == "running"]
    assert len(running) >= 2, "the reply should arrive in pieces"
    texts = [answer_of(u) for u in running if answer_of(u) != "…"]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:])), "each update extends the last"
    done = updates[-1]
    assert done.status == "done" and done.stats["generated_tokens"] == 6
    assert [m["role"] for m in done.messages] == ["user", "assistant"]
    assert done.messages[0]["content"] == "hello there"
    assert answer_of(done) == visible(reference(["hello there"])[0][1])
    assert host.draft is None and "store</td>" in chats.monitor.render()  # no speculation: no draft source named


def test_the_second_turn_forwards_only_its_new_tokens(host, reference):
    chats = Chats(host, Monitor(host))
    finish(chats.reply("a", "hello there", GREEDY))
    held = chats.info("a")["state_tokens"]  # the first prompt and reply, but its last token
    second = finish(chats.reply("a", "and a second question", GREEDY))[-1].stats
    assert second["reused_tokens"] == held > 0
    assert second["forwarded_tokens"] == second["prompt_tokens"] - held + second["generated_tokens"] - 1
    assert chats.info("a")["last"]["answer"] == reference(["hello there", "and a second question"])[1][1]


def test_closing_the_reply_stops_the_engine_and_the_session_stays_usable(host, reference):
    monitor = Monitor(host)
    chats = Chats(host, monitor)
    engine = host.engine
    with slowed(engine, 0.002):  # ~20 ms a token on this 10-layer model
        gen = chats.reply("s", "hello there", SamplingParams(max_tokens=400))
        seen = 0
        for u in gen:
            if u.status == "running" and answer_of(u) != "…":
                seen += 1
                if seen == 2:
                    live = monitor.snapshot()["live"]
                    assert live is not None and 1 <= live["layer"] <= live["layers"] == 10
                    assert "layer " in monitor.render() and "/ 10" in monitor.render()
                    break
        gen.close()  # what Gradio does on Stop: the generator's cleanup sets the stop flag
        assert chats.wait_idle("s", 30)
    last = chats.info("s")["last"]
    assert last["reason"] == "cancelled" and 0 < last["generated_tokens"] < 400
    forwarded = engine.tokens_forwarded
    time.sleep(0.1)
    assert engine.tokens_forwarded == forwarded, "the engine went on after the stop"
    assert monitor.snapshot()["live"] is None and monitor.last["reason"] == "cancelled"
    assert "cancelled" in monitor.render()
    # the cut reply is closed in the history, so the next turn still only forwards its own tokens
    held = chats.info("s")["state_tokens"]
    nxt = finish(chats.reply("s", "and a second question", GREEDY))[-1]
    assert nxt.status == "done", nxt.note
    assert nxt.stats["reused_tokens"] == held == last["prompt_tokens"] + last["generated_tokens"] - 1
    assert [m["role"] for m in nxt.messages] == ["user", "assistant", "user", "assistant"]


def test_two_sessions_keep_their_own_history_and_state(host, reference):
    chats = Chats(host, Monitor(host), keep_states=2)
    finish(chats.reply("x", "hello there", GREEDY))
    finish(chats.reply("y", "a third one", GREEDY))
    x2 = finish(chats.reply("x", "and a second question", GREEDY))[-1]
    y2 = finish(chats.reply("y", "fourth", GREEDY))[-1]
    assert [m["content"] for m in x2.messages if m["role"] == "user"] == ["hello there", "and a second question"]
    assert [m["content"] for m in y2.messages if m["role"] == "user"] == ["a third one", "fourth"]
    assert x2.stats["reused_tokens"] > 0 and y2.stats["reused_tokens"] > 0
    assert answer_of(x2) == visible(reference(["hello there", "and a second question"])[1][1])
    assert answer_of(y2) == visible(reference(["a third one", "fourth"])[1][1])


def test_a_freed_decode_state_is_recomputed_exactly(host, reference):
    monitor = Monitor(host)
    chats = Chats(host, monitor, keep_states=1)
    finish(chats.reply("p", "hello there", GREEDY))
    finish(chats.reply("q", "a third one", GREEDY))  # only one state may live: p's is freed
    assert not chats.info("p")["state_live"] and chats.info("q")["state_live"]
    panel = []  # what the engine panel says while p's turn runs
    with on_each_layer(host.engine, lambda: panel.append(monitor.render()) if not panel else None):
        again = finish(chats.reply("p", "and a second question", GREEDY))[-1]
    assert "recomput" in again.note and "recomputing" in panel[0] and "decode state" in panel[0]
    assert again.stats["reused_tokens"] == 0
    assert answer_of(again) == visible(reference(["hello there", "and a second question"])[1][1])


def test_thinking_is_a_collapsed_block_apart_from_the_answer(host, reference):
    chats = Chats(host, Monitor(host))
    done = finish(chats.reply("t", "hello there", SamplingParams(max_tokens=12), mode="thinking"))[-1]
    thinking, answer = reference(["hello there"], "thinking", SamplingParams(max_tokens=12))[0]
    block = done.messages[1]
    assert block["metadata"] == {"title": "Thinking", "status": "done"} and block["content"] == thinking
    assert done.messages[-1]["content"] == (answer or "*(the reply ended while still thinking)*")


def test_undo_retry_and_clear(host, reference):
    chats = Chats(host, Monitor(host))
    first = finish(chats.reply("u", "hello there", GREEDY))[-1]
    finish(chats.reply("u", "and a second question", GREEDY))
    assert chats.undo("u") == "and a second question"
    assert chats.messages("u") == first.messages
    retried = finish(chats.reply("u", "and a second question", GREEDY))[-1]
    assert retried.stats["reused_tokens"] == 0  # the recurrent state cannot be rewound: recomputed
    assert answer_of(retried) == visible(reference(["hello there", "and a second question"])[1][1])
    chats.clear("u")
    assert chats.messages("u") == [] and chats.info("u")["history_tokens"] == 0


def test_a_refused_message_leaves_the_conversation_as_it_was(host):
    chats = Chats(host, Monitor(host))
    finish(chats.reply("r", "hello there", GREEDY))
    before = chats.info("r")
    bad = finish(chats.reply("r", "markup <|sep|> typed in", GREEDY))[-1]
    assert bad.status == "error" and "special-token" in bad.note
    assert chats.info("r")["history_tokens"] == before["history_tokens"]
    ok = finish(chats.reply("r", "and a second question", GREEDY))[-1]
    assert ok.status == "done" and ok.stats["reused_tokens"] == before["state_tokens"] > 0


def test_a_system_prompt_change_recomputes_with_it(host):
    chats = Chats(host, Monitor(host))
    finish(chats.reply("m", "hello there", GREEDY, system="Be brief."))
    changed = finish(chats.reply("m", "and a second question", GREEDY, system="Be verbose."))[-1]
    assert "system prompt changed" in changed.note and changed.stats["reused_tokens"] == 0
    assert chats.slots["m"].chat.conv.messages[0] == {"role": "system", "content": "Be verbose."}


def test_a_reply_with_markup_text_does_not_break_the_next_turn(host):
    """The random test model writes e.g. "<|sep|>" as text; the next turn must still reuse the exact ids."""
    chats = Chats(host, Monitor(host))
    first = finish(chats.reply("k", "hello there", SamplingParams(max_tokens=200)))[-1]
    raw = "".join(m["content"] for m in first.messages if m["role"] == "assistant")
    assert any(t in raw for t in host.tokenizer.added_tokens if len(t) > 1), \
        "this prompt should make the test model write an added token's text"
    held = chats.info("k")["state_tokens"]
    nxt = finish(chats.reply("k", "and a second question", GREEDY))[-1]
    assert nxt.status == "done" and nxt.stats["reused_tokens"] == held


def test_each_turn_is_logged_by_its_numbers_never_by_its_text_or_session_id(host, caplog):
    import logging

    chats = Chats(host, Monitor(host))
    with caplog.at_level(logging.INFO, logger="k3.ui"):
        finish(chats.reply("a-secret-session-id", "my private question", GREEDY))
    lines = [r.getMessage() for r in caplog.records if r.name == "k3.ui"]
    assert len(lines) == 1 and re.fullmatch(r"session [0-9a-f]{8}: \d+ prompt tokens \(0 reused\), \d+ generated "
                                            r"\([a-z ]+\), (\d+\.\d{3}|-) s/token", lines[0]), lines
    assert "private" not in lines[0] and "a-secret" not in lines[0]


def test_an_oversized_message_is_refused_and_the_conversation_kept(host):
    from ui.chat import MAX_MESSAGE_CHARS

    chats = Chats(host, Monitor(host))
    first = finish(chats.reply("big", "hello there", GREEDY))[-1]
    forwarded = host.engine.tokens_forwarded
    refused = finish(chats.reply("big", "x" * (MAX_MESSAGE_CHARS + 1), GREEDY))[-1]
    assert refused.status == "error" and "over the limit of 32,000" in refused.note
    assert refused.messages == first.messages and host.engine.tokens_forwarded == forwarded


def test_a_prompt_over_the_context_is_refused_naming_the_limit_and_the_conversation_kept(small_model):
    from k3core import EngineConfig
    from ui.host import EngineHost

    host = EngineHost(EngineConfig(small_model, max_context=64))
    try:
        chats = Chats(host, Monitor(host))
        finish(chats.reply("c", "hi", SamplingParams(max_tokens=3)))[-1]
        refused = finish(chats.reply("c", "tell me more " * 20, GREEDY))[-1]
        assert refused.status == "error" and "over the context limit of 64" in refused.note
        assert [m["content"] for m in refused.messages if m["role"] == "user"] == ["hi"]
        again = finish(chats.reply("c", "ok", SamplingParams(max_tokens=3)))[-1]
        assert again.status == "done" and again.stats["reused_tokens"] > 0  # the refusal forwarded nothing
    finally:
        host.close()


def test_with_speculation_the_reply_is_the_same_and_the_panel_shows_acceptance(small_model, reference):
    config, _ = ui_args(small_model, "--speculate", "auto")
    assert config.speculate == 8
    host = EngineHost(config, lambda: speculation("ngram", "auto"))
    try:
        monitor = Monitor(host)
        chats = Chats(host, monitor)
        seen = []
        with on_each_layer(host.engine, lambda: seen.append(monitor.render()) if len(seen) < 400 else None):
            done = finish(chats.reply("s", "hello there", GREEDY))[-1]
        assert answer_of(done) == visible(reference(["hello there"])[0][1])
        assert any('id="k3-drafts"' in html for html in seen)  # live, while the reply runs
        assert 'id="k3-drafts"' in monitor.render() and "passes for the prompt and 6 tokens" in monitor.render()
        assert "store · ngram drafts</td>" in monitor.render()  # the engine plugins row names the draft source
    finally:
        host.close()
