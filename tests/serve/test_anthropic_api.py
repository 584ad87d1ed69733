"""`k3 serve`'s Anthropic Messages API driven by the official `anthropic` package (and raw HTTP where the client
hides the wire), live on 127.0.0.1 on the demo model and a generated one: the same worker as chat completions."""
from __future__ import annotations

import json

import anthropic
import jsonschema
import httpx
import pytest

from .conftest import CALLS, KEY, Live, burst, script_tool_calls

PARIS = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}  # the SDK has no sampling arguments: they go in the body as they are
TOOLS = [{"name": "get_weather", "description": "weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]


def client(live: Live, key: str | None = None) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=live.url, api_key=key or "none", max_retries=0, timeout=120)


def prompt_ids(usage) -> int:
    """The prompt's length from a Messages usage: ids read from the prompt cache, kept into it, and the rest."""
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def without_ids(message) -> dict:
    """The message without its ids, its usage as the prompt's whole length (a second identical request reads
    what the first one kept from the prompt cache: the same ids, counted as cache reads)."""
    body = message.model_dump(exclude_none=True)
    del body["id"]
    u = body.pop("usage")
    body["usage"] = (u["input_tokens"] + u.get("cache_read_input_tokens", 0) + u.get("cache_creation_input_tokens", 0),
                     u["output_tokens"])
    for block in body["content"]:
        block.pop("id", None)
    return body


def test_create_answers_in_text_blocks_with_usage(demo):
    r = client(demo).messages.create(model=demo.name, max_tokens=64, messages=PARIS, metadata={"user_id": "u"},
                                     extra_body=GREEDY)
    assert r.type == "message" and r.role == "assistant" and r.model == demo.name and r.id.startswith("msg_")
    assert [(b.type, b.text) for b in r.content] == [("text", "The capital of France is Paris.")]
    assert r.stop_reason == "end_turn" and r.stop_sequence is None
    u = r.usage
    assert u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens > 0 and u.output_tokens > 0


def test_a_stream_is_the_whole_reply_event_by_event(demo):
    c = client(demo)
    whole = c.messages.create(model=demo.name, max_tokens=64, messages=PARIS, extra_body=GREEDY)
    with c.messages.stream(model=demo.name, max_tokens=64, messages=PARIS, extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text and without_ids(final) == without_ids(whole)
    body = {"model": demo.name, "max_tokens": 64, "messages": PARIS, "temperature": 0, "stream": True}
    with httpx.stream("POST", demo.url + "/v1/messages", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        frames = [f for f in r.read().decode().split("\n\n") if f]
    events = [(f.split("\n")[0].removeprefix("event: "), json.loads(f.split("\n")[1].removeprefix("data: ")))
              for f in frames]
    assert all(name == data["type"] for name, data in events)
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"] and names[-3:] == [
        "content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert events[-2][1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert events[-2][1]["usage"]["output_tokens"] == whole.usage.output_tokens


def test_stop_sequences_and_max_tokens_name_why_the_reply_ended(demo):
    c = client(demo)
    r = c.messages.create(model=demo.name, max_tokens=64, messages=PARIS, extra_body=GREEDY, stop_sequences=["Paris"])
    assert r.content[0].text == "The capital of France is " and r.stop_reason == "stop_sequence"
    assert r.stop_sequence == "Paris"
    r = c.messages.create(model=demo.name, max_tokens=3, messages=PARIS, extra_body=GREEDY)
    assert r.usage.output_tokens == 3 and r.stop_reason == "max_tokens"


def test_thinking_comes_back_as_a_thinking_block(demo):
    c = client(demo)
    ask = dict(model=demo.name, max_tokens=24, messages=PARIS, extra_body=GREEDY,
               thinking={"type": "enabled", "budget_tokens": 16})
    r = c.messages.create(**ask)
    kinds = [b.type for b in r.content]
    assert kinds and kinds[0] == "thinking" and set(kinds) <= {"thinking", "text"} and r.content[0].thinking
    with c.messages.stream(**ask) as stream:
        assert without_ids(stream.get_final_message()) == without_ids(r)
    # the turn sent back with its thinking block renders as it was generated
    follow = PARIS + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
                      {"role": "user", "content": "And of Italy?"}]
    before = demo.engine.tokens_forwarded
    again = c.messages.create(**{**ask, "messages": follow})
    kept = prompt_ids(r.usage) + r.usage.output_tokens - 1  # the first turn's state: all its ids but the last
    # the engine forwarded only the new prompt ids and the reply's (all but its last)
    assert again.usage.cache_read_input_tokens == kept
    assert demo.engine.tokens_forwarded - before == prompt_ids(again.usage) - kept + again.usage.output_tokens - 1


def test_a_seeded_message_is_the_seeded_chat_completion(demo):
    sampled = {"temperature": 0.9, "seed": 11}
    r = client(demo).messages.create(model=demo.name, max_tokens=12, messages=PARIS, extra_body=sampled)
    chat = demo.client.chat.completions.create(model=demo.name, max_tokens=12, messages=PARIS, **sampled)
    assert r.content[0].text == chat.choices[0].message.content and r.usage.output_tokens == 12


def test_count_tokens_is_the_created_messages_input_tokens(demo):
    c = client(demo)
    system = "You answer in one sentence."
    r = c.messages.create(model=demo.name, max_tokens=8, messages=PARIS, system=system, extra_body=GREEDY)
    counted = c.messages.count_tokens(model=demo.name, messages=PARIS, system=[{"type": "text", "text": system}])
    u = r.usage
    assert counted.input_tokens == u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
    assert counted.input_tokens > c.messages.count_tokens(model=demo.name, messages=PARIS).input_tokens


def test_a_tool_use_round_trip(generated, monkeypatch):
    """Every pick follows a script (the model's output forced to two complete XTML tool calls): the reply is
    tool_use blocks with parsed input, whole and streamed; the results go back as tool_result blocks."""
    calls, script = CALLS, script_tool_calls(monkeypatch, generated)
    c = client(generated)
    ask = dict(model=generated.name, max_tokens=len(script), tools=TOOLS,
               messages=[{"role": "user", "content": "weather in Paris?"}])
    r = c.messages.create(**ask)
    assert r.stop_reason == "tool_use" and [b.type for b in r.content] == ["text", "tool_use", "tool_use"]
    assert r.content[0].text == "Checking." and [(b.name, b.input) for b in r.content[1:]] == calls
    with c.messages.stream(**ask) as stream:
        deltas = [e.delta.partial_json for e in stream if e.type == "content_block_delta"
                  and e.delta.type == "input_json_delta"]
        final = stream.get_final_message()
    assert [json.loads(d) for d in deltas] == [args for _, args in calls]
    assert without_ids(final) == without_ids(r)
    monkeypatch.undo()  # the real sampler again
    follow = ask["messages"] + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
                                {"role": "user", "content": [
                                    {"type": "tool_result", "tool_use_id": r.content[1].id, "content": "sunny, 21 C"},
                                    {"type": "tool_result", "tool_use_id": r.content[2].id,
                                     "content": [{"type": "text", "text": "rain"}]}]}]
    again = c.messages.create(**{**ask, "max_tokens": 3, "messages": follow})
    assert prompt_ids(again.usage) > prompt_ids(r.usage) + r.usage.output_tokens


BOUNDED = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
           "additionalProperties": False}


@pytest.mark.parametrize("choice", [{"type": "tool", "name": "get_weather"}, {"type": "any"}])
def test_a_forced_tool_choice_is_a_call_whose_input_fits_the_schema(generated, choice):
    """On a random model: the mask holds the call to the tool's input_schema (a bounded string, so it ends)."""
    r = client(generated).messages.create(model=generated.name, max_tokens=120, tool_choice=choice,
                                          tools=[{**TOOLS[0], "input_schema": BOUNDED}],
                                          messages=[{"role": "user", "content": "weather in Paris?"}])
    assert r.stop_reason == "tool_use" and r.content[-1].type == "tool_use" and r.content[-1].name == "get_weather"
    jsonschema.validate(r.content[-1].input, BOUNDED)


def test_a_tool_choice_header_forces_a_call_on_a_user_turn_only(generated):
    """x-k3-tool-choice, for a client that sends no tool_choice (Claude Code can add a header): a user turn's reply
    is the call; a turn after tool results is not forced (a name no tool has is not even looked at there); a body's
    own tool_choice wins; a name the request does not declare is a 400 naming the header."""
    c, tools = client(generated), [{**TOOLS[0], "input_schema": BOUNDED}]
    ask = dict(model=generated.name, max_tokens=120, tools=tools, messages=[{"role": "user", "content": "hi"}])
    r = c.messages.create(**ask, extra_headers={"x-k3-tool-choice": "get_weather"})
    assert r.stop_reason == "tool_use" and r.content[-1].name == "get_weather"
    late_system = [*ask["messages"], {"role": "system", "content": "Be brief."}]  # as Claude Code sends it
    forced = c.messages.create(**{**ask, "messages": late_system}, extra_headers={"x-k3-tool-choice": "get_weather"})
    assert forced.stop_reason == "tool_use"
    follow = [*ask["messages"], {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": r.content[-1].id, "content": "sun"}]}]
    c.messages.create(**{**ask, "max_tokens": 2, "messages": follow}, extra_headers={"x-k3-tool-choice": "nothing"})
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(**ask, extra_headers={"x-k3-tool-choice": "nothing"})
    assert e.value.body["error"]["message"].startswith("x-k3-tool-choice: must be any, auto, none or the name")
    r = c.messages.create(**ask, tool_choice={"type": "none"}, extra_headers={"x-k3-tool-choice": "nothing"})
    assert r.stop_reason != "tool_use"


def test_errors_are_the_sdks_typed_exceptions(demo):
    c = client(demo)
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model=demo.name, max_tokens=anthropic.omit, messages=PARIS)
    assert e.value.status_code == 400 and e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert e.value.body["error"]["message"].startswith("max_tokens: required")
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model=demo.name, max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])
    assert e.value.body["error"]["message"] == "messages[0].content[1]: image blocks are not served: k3 reads text only"
    with pytest.raises(anthropic.NotFoundError) as e:
        c.messages.create(model="claude-9", max_tokens=8, messages=PARIS)
    assert e.value.body["error"]["type"] == "not_found_error"


@pytest.mark.parametrize("body, param", [
    ({"messages": PARIS, "max_tokens": 0}, "max_tokens"),
    ({"messages": PARIS, "max_tokens": 8, "temperature": 1.5}, "temperature"),
    ({"messages": PARIS, "max_tokens": 8, "seed": -1}, "seed"),
    ({"messages": PARIS, "max_tokens": 8, "stop_sequences": "Paris"}, "stop_sequences"),
    ({"messages": PARIS, "max_tokens": 8, "stop_sequences": ["x"] * 17}, "stop_sequences"),
    ({"messages": PARIS, "max_tokens": 8, "output_config": "json"}, "output_config"),
    ({"messages": PARIS, "max_tokens": 8, "tool_choice": {"type": "auto", "disable_parallel_tool_use": "yes"}},
     "tool_choice.disable_parallel_tool_use"),
    ({"messages": PARIS, "max_tokens": 8, "output_config": {"format": {"type": "json_schema", "schema": {
        "type": "array", "uniqueItems": True}}}}, "output_config.format.schema"),
    ({"messages": PARIS, "max_tokens": 8, "mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]},
     "mcp_servers"),
    ({"messages": PARIS, "max_tokens": 8, "system": [{"type": "image"}]}, "system[0]"),
    ({"messages": [{"role": "system", "content": "hi"}], "max_tokens": 8}, "messages"),
    ({"messages": [{"role": "tool", "content": "hi"}], "max_tokens": 8}, "messages[0].role"),
    ({"messages": PARIS, "max_tokens": 8, "thinking": {"type": "adaptive", "display": "hidden"}}, "thinking.display"),
    ({"messages": PARIS, "max_tokens": 8, "tools": [{**TOOLS[0], "defer_loading": "yes"}]}, "tools[0].defer_loading"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "", "signature": "k3-thinking-v1:%%%"}]}, *PARIS], "max_tokens": 8},
     "messages[1].content[0].signature"),
    ({"messages": PARIS, "max_tokens": 8, "thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"messages": PARIS, "max_tokens": 8, "tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"messages": PARIS, "max_tokens": 8, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     "tools[0].type"),
    ({"messages": PARIS, "max_tokens": 8, "tool_choice": {"type": "any"}}, "tool_choice"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}],
      "max_tokens": 8}, "messages[0].content[0].tool_use_id"),
    ({"messages": [*PARIS, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                             "input": "x"}]}], "max_tokens": 8},
     "messages[1].content[0].input"),
    ({"messages": [*PARIS, {"role": "assistant", "content": "<|end_of_msg|>"}], "max_tokens": 8}, "messages[1]"),
])
def test_each_bad_field_is_a_400_naming_it(demo, body, param):
    r = httpx.post(demo.url + "/v1/messages", json={"model": demo.name, **body},
                   headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 400 and r.json()["type"] == "error", r.text
    assert r.json()["error"]["type"] == "invalid_request_error" and r.json()["error"]["message"].startswith(param + ":")


def test_an_api_key_by_either_header(model_factory):
    live = Live(model_factory("small"), api_key=KEY)
    try:
        body = {"model": live.name, "max_tokens": 2, "messages": PARIS}
        assert client(live, KEY).messages.create(**body).usage.output_tokens == 2  # the SDK sends Authorization
        by_header = httpx.post(live.url + "/v1/messages", json=body, headers={"x-api-key": KEY}, timeout=60)
        assert by_header.status_code == 200 and by_header.json()["usage"]["output_tokens"] == 2
        with pytest.raises(anthropic.AuthenticationError) as e:
            client(live, "not-the-key-at-all").messages.create(**body)
        assert e.value.status_code == 401 and e.value.body["error"]["type"] == "authentication_error"
        assert KEY not in e.value.body["error"]["message"]
        r = httpx.post(live.url + "/v1/messages/count_tokens", json=body, headers={"x-api-key": "wrong"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    finally:
        live.close()


def test_a_full_queue_is_overloaded_with_retry_after(model_factory):
    live = Live(model_factory("small"), sequences=1, queue_size=1)
    try:
        body = {"model": live.name, "max_tokens": 64, "messages": [{"role": "user", "content": "long"}]}
        results = burst(live, "/v1/messages", body)
        codes = sorted(r.status_code for r in results)
        assert codes.count(200) >= 2 and 529 in codes, codes
        busy = next(r for r in results if r.status_code == 529)
        assert int(busy.headers["Retry-After"]) >= 1 and busy.json()["error"]["type"] == "overloaded_error"
    finally:
        live.close()


def test_system_messages_fold_into_the_system_text_and_the_billing_header_is_left_out():
    """As Claude Code sends them: the billing-header block is no part of the prompt, a system-role message inside
    `messages` follows the system text after a blank line, and cache_control breakpoints keep their offsets."""
    from serve.anthropic_schema import messages_request

    mark = {"type": "ephemeral"}
    body = {"model": "k3", "max_tokens": 8,
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abcde;"},
                       {"type": "text", "text": "Be kind.", "cache_control": mark}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": mark}]},
                         {"role": "system", "content": [{"type": "text", "text": "Env.", "cache_control": mark}]}]}
    read = messages_request(body)
    assert read.request.messages == ({"role": "system", "content": "Be kind.\n\nEnv."}, {"role": "user", "content": "Hi"})
    assert read.request.breakpoints == ((0, 8), (0, 14), (1, 2)) and read.places == ["system", "messages[0]"]
    plain = messages_request({**body, "system": "x-anthropic-billing-header: kept as a string is"})
    assert plain.request.messages[0]["content"].startswith("x-anthropic-billing-header: kept")
