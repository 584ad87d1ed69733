"""Claude Code's requests (tests/fixtures/claude_code: every field and block as its CLI sent them, the texts
replaced by generated ones of the same length) replayed through the `anthropic` package against `k3 serve` on
the demo model: each one is counted whole, and served and read back by the SDK; the billing header that changes
on every request changes no prompt id; the turn after a tool call resumes from the turn before.

The served bodies are the same shapes with every text cut to TEXT_CHARS: Claude Code's first prompt is ~30,000
demo ids, minutes of prefill here; `make claude-check` runs the CLI itself at full length."""
from __future__ import annotations

import copy
import json

import anthropic
import pytest

from ..conftest import DEMO_MODEL, FIXTURES
from .conftest import Live

SHAPES = json.loads((FIXTURES / "claude_code" / "requests.json").read_text())["scenarios"]
REQUESTS = [(name, i, r) for name, rs in SHAPES.items() for i, r in enumerate(rs)]
TEXT_CHARS = 120
BILLING = "x-anthropic-billing-header:"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    server = Live(DEMO_MODEL, max_context=16384, cache_dir=tmp_path_factory.mktemp("prompt-cache"))
    yield server
    server.close()


def client(live) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=live.url, api_key="none", max_retries=0, timeout=600)


def cut(value):
    """Every string past TEXT_CHARS cut there (the billing header stays whole: its form is what is tested)."""
    if isinstance(value, dict):
        return {k: cut(v) for k, v in value.items()}
    if isinstance(value, list):
        return [cut(v) for v in value]
    if isinstance(value, str) and not value.startswith(BILLING):
        return value[:TEXT_CHARS]
    return value


def count(c, body) -> int:
    fields = {k: body[k] for k in ("model", "messages", "system", "tools", "thinking", "output_config",
                                   "context_management") if k in body}
    return c.beta.messages.count_tokens(**fields).input_tokens


def send(c, body, headers=None):
    """The request as Claude Code sends it (streamed, to /v1/messages?beta=true), read by the SDK; seeded (k3's `seed`,
    which Claude Code does not send): at temperature 1 the demo model skips thinking on some draws (seeds 1 and 2 on
    tool-turn-1) and calls a tool on others (`say hi` asked with no limit), and a fresh random seed each run made the
    assertions on them pass by chance."""
    fields = {k: v for k, v in body.items() if k != "stream"}
    fields["extra_body"] = {"seed": 0}
    with c.beta.messages.stream(**fields, extra_headers=headers or {}) as stream:
        events = [e.type for e in stream]
        return stream.get_final_message(), events


@pytest.mark.parametrize("name, i, request_", REQUESTS, ids=[f"{n}-{i}" for n, i, _ in REQUESTS])
def test_each_request_is_counted_whole(live, name, i, request_):
    """At full length: far past the 4096 positions of the old default context, and counted (count_tokens counts
    a prompt of any length)."""
    assert request_["path"] == "/v1/messages?beta=true"
    assert count(client(live), request_["body"]) > 16384


@pytest.mark.parametrize("name, i, request_", REQUESTS, ids=[f"{n}-{i}" for n, i, _ in REQUESTS])
def test_each_request_is_served_and_read_back_by_the_sdk(live, name, i, request_):
    body = cut(request_["body"])
    assert body["max_tokens"] == 32000 and body["thinking"] == {"type": "adaptive", "display": "omitted"}
    message, events = send(client(live), {**body, "max_tokens": 48}, request_["headers"])
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert message.stop_reason in ("end_turn", "max_tokens", "tool_use") and message.content
    thinking = [b for b in message.content if b.type == "thinking"]
    assert thinking and all(b.thinking == "" and b.signature.startswith("k3-thinking-v1:") for b in thinking)
    u = message.usage
    assert u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens == count(client(live), body)


def test_max_tokens_past_the_context_is_clamped_not_refused(live):
    body = cut(SHAPES["say-hi"][0]["body"])
    message, _ = send(client(live), {**body, "max_tokens": 10 ** 9})
    assert message.stop_reason in ("end_turn", "max_tokens")


def test_a_billing_header_that_changes_changes_no_prompt_id(live):
    """Two requests that differ only in the billing header's cch: the same count, and the second resumes from the
    first at its last id (without the header left out, the prompts part inside the system text)."""
    c, body = client(live), cut(SHAPES["say-hi"][0]["body"])
    first, second = copy.deepcopy(body), copy.deepcopy(body)
    for b, cch in ((first, "1a2b3"), (second, "fe4d5")):
        assert b["system"][0]["text"].startswith(BILLING)
        b["system"][0]["text"] = f"{BILLING} cc_version=9.9.9; cc_entrypoint=cli; cch={cch};"
        b["messages"][0]["content"][-1]["text"] = "a question asked only here, twice"
    n = count(c, first)
    assert count(c, second) == n
    send(c, {**first, "max_tokens": 4})
    again, _ = send(c, {**second, "max_tokens": 4})
    assert again.usage.cache_read_input_tokens == n - 1


def test_the_turn_after_a_tool_call_resumes_from_the_turn_before(live):
    """The tool turn's second request holds the first one's conversation, the tool_use the CLI ran and its
    result: it forwards only what follows the first request's last message."""
    c = client(live)
    first, second = (cut(r["body"]) for r in SHAPES["tool-turn"])
    for b in (first, second):  # a conversation no other test sent
        b["messages"][0]["content"][-1]["text"] = "read the notes, as asked only here"
    n = count(c, first)
    send(c, {**first, "max_tokens": 4})
    after, _ = send(c, {**second, "max_tokens": 4})
    prefix = 2 + len(live.slot.tokenizer.encode("think"))  # the first prompt ends opening the think channel
    assert after.usage.cache_read_input_tokens == n - prefix
