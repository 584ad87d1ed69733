"""Issue 28, "Server details": what a client sees for requests k3 refuses (a method a route does not take, a message
without content, `best_of`, the penalties) — status, headers and the exact error body — and that a forced tool call
(`tool_choice: "required"`) is a call or an error, never an empty reply that says it stopped. Live servers on the
demo model and a generated one (tests/serve/conftest.py)."""
from __future__ import annotations

import json

import httpx
import pytest

PARIS = [{"role": "user", "content": "What is the capital of France?"}]


def openai_error(message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


def anthropic_error(message: str, kind: str = "invalid_request_error") -> dict:
    return {"type": "error", "error": {"type": kind, "message": message}}


# ---- 1. a method the route does not take: 405, Allow, the path's dialect ----------------------------------------

@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses"])
def test_get_on_an_openai_post_route_is_405_invalid_request_with_allow(demo, path):
    r = httpx.get(demo.url + path)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json() == openai_error(f"GET {path}: method not allowed; this route takes POST")


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_get_on_an_anthropic_route_is_405_in_anthropics_shape(demo, path):
    r = httpx.get(demo.url + path, headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json() == anthropic_error(f"GET {path}: method not allowed; this route takes POST")


def test_allow_names_every_method_a_path_takes_and_a_missing_route_keeps_its_404(demo):
    r = httpx.put(demo.url + "/v1/responses/resp_x", json={})  # two routes share the path: GET and DELETE
    assert r.status_code == 405 and r.headers["allow"] == "DELETE, GET"
    assert r.json() == openai_error("PUT /v1/responses/resp_x: method not allowed; this route takes DELETE or GET")
    r = httpx.post(demo.url + "/v1/models", json={})
    assert r.status_code == 405 and r.headers["allow"] == "GET"
    assert r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.get(demo.url + "/v1/nothing")
    assert r.status_code == 404 and "allow" not in r.headers
    assert r.json() == {"error": {"message": "no route GET /v1/nothing", "type": "not_found_error", "param": None,
                                  "code": "unknown_url"}}
    r = httpx.get(demo.url + "/v1/messages/batches")  # under /v1/messages: Anthropic's dialect
    assert r.status_code == 404
    assert r.json() == anthropic_error("no route GET /v1/messages/batches", "not_found_error")


# ---- 2. a message without content -------------------------------------------------------------------------------

NO_CONTENT = "(only an assistant message may have no content)"


@pytest.mark.parametrize("role", ["user", "system", "developer", "tool"])
def test_a_null_content_is_refused_naming_the_message(demo, role):
    messages = [{"role": "user", "content": "hi"}, {"role": role, "content": None}]
    r = httpx.post(demo.url + "/v1/chat/completions", json={"model": demo.name, "messages": messages, "max_tokens": 2})
    assert r.status_code == 400
    assert r.json() == openai_error(f"messages[1].content: must be a string or a list of text parts, got null "
                                    f"{NO_CONTENT}", "messages[1].content", "invalid_value")
    r = httpx.post(demo.url + "/v1/chat/completions", json={"model": demo.name, "max_tokens": 2,
                                                            "messages": [{"role": role}]})
    assert r.status_code == 400
    assert r.json() == openai_error(f"messages[0].content: required {NO_CONTENT}", "messages[0].content",
                                    "invalid_value")


def test_an_assistant_message_may_have_null_content(demo):
    """As OpenAI takes it after tool calls; and k3's own reasoning_content turn that only thought."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    called = PARIS + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    thought = PARIS + [{"role": "assistant", "content": None, "reasoning_content": "Hm."},
                       {"role": "user", "content": "And of Italy?"}]
    for messages in (called, thought):
        r = httpx.post(demo.url + "/v1/chat/completions", json={"model": demo.name, "messages": messages,
                                                                "tools": tools, "max_tokens": 2}, timeout=60)
        assert r.status_code == 200, r.text


def test_the_other_dialects_refuse_a_null_content_too(demo):
    r = httpx.post(demo.url + "/v1/responses", json={"model": demo.name, "max_output_tokens": 2,
                                                     "input": [{"role": "user", "content": None}]})
    assert r.status_code == 400
    assert r.json() == openai_error("input[0].content: must be a string or a list of input_text parts",
                                    "input[0].content", "invalid_value")
    r = httpx.post(demo.url + "/v1/messages", json={"model": demo.name, "max_tokens": 2,
                                                    "messages": [{"role": "user", "content": None}]})
    assert r.status_code == 400
    assert r.json() == anthropic_error("messages[0].content: must be a string or a list of content blocks")


# ---- 3. best_of, as n ------------------------------------------------------------------------------------------

def test_best_of_over_1_is_refused_as_n_is(demo):
    ask = {"model": demo.name, "prompt": "The capital of", "max_tokens": 2, "temperature": 0}
    r = httpx.post(demo.url + "/v1/completions", json={**ask, "best_of": 3})
    assert r.status_code == 400
    assert r.json() == openai_error("best_of: only best_of = 1 is served (one completion generated per request, none "
                                    "to choose among), got 3", "best_of", "invalid_value")
    n = httpx.post(demo.url + "/v1/completions", json={**ask, "n": 3})
    assert n.status_code == 400
    assert n.json() == openai_error("n: only n = 1 is served (one choice per request), got 3", "n", "invalid_value")
    for one in (1, None):
        r = httpx.post(demo.url + "/v1/completions", json={**ask, "best_of": one, "n": one}, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["text"], r.text
    r = httpx.post(demo.url + "/v1/completions", json={**ask, "best_of": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of"


# ---- 4. the penalties' refusal: a whole sentence, saying what k3 does instead ------------------------------------

@pytest.mark.parametrize("route, ask", [("/v1/chat/completions", {"messages": PARIS}),
                                        ("/v1/completions", {"prompt": "The capital of"})])
@pytest.mark.parametrize("name", ["presence_penalty", "frequency_penalty"])
def test_a_penalty_refusal_says_what_to_send_instead(demo, route, ask, name):
    r = httpx.post(demo.url + route, json={"model": demo.name, **ask, name: 0.5})
    assert r.status_code == 400
    assert r.json() == openai_error(
        f"{name}: not served, got 0.5 (only 0 is accepted); send k3's own `repetition_penalty` field instead, which "
        "makes every id already in the context less likely (a number > 0, 1 = off).", name, "invalid_value")
    r = httpx.post(demo.url + route, json={"model": demo.name, **ask, name: 0, "repetition_penalty": 1.3,
                                           "max_tokens": 2}, timeout=60)
    assert r.status_code == 200, r.text


# ---- 5. tool_choice "required": a call, or an error, or a reply cut off by max_tokens -----------------------------

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather in a city",
                                           "parameters": CITY}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {},
                                                                              "additionalProperties": False}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_forced(r: httpx.Response, max_tokens: int | None = None) -> str:
    """A reply to tool_choice "required": calls to declared tools with arguments their parameters take, or cut off at
    max_tokens (finish_reason length) with no call made up and no text; never an empty reply that stopped."""
    assert r.status_code < 300 or 400 <= r.status_code < 600, r.text
    if r.status_code >= 400:
        return "error"
    choice = r.json()["choices"][0]
    message, finish = choice["message"], choice["finish_reason"]
    assert message["content"] == "" and finish in ("tool_calls", "length"), (finish, message)
    calls = message.get("tool_calls") or []
    for call in calls:
        arguments = json.loads(call["function"]["arguments"])
        assert call["function"]["name"] in ("get_weather", "get_time"), call
        assert set(arguments) == ({"city"} if call["function"]["name"] == "get_weather" else set()), call
    if finish == "tool_calls":
        assert calls, message
    elif not calls:  # cut off before a call was whole: documented (docs/SERVER.md, Tools), and said by "length"
        assert "tool_calls" not in message
        if max_tokens is not None:
            assert r.json()["usage"]["completion_tokens"] == max_tokens
    return "calls" if calls else "cut"


def forced(live, **fields) -> httpx.Response:
    body = {"model": live.name, "messages": ASK, "tools": TOOLS, "tool_choice": "required", **fields}
    return httpx.post(live.url + "/v1/chat/completions", json=body, timeout=120)


@pytest.mark.parametrize("server", ["demo", "generated"])
def test_required_is_a_call_or_cut_off_at_every_max_tokens(server, request):
    live = request.getfixturevalue(server)
    seen = set()
    for max_tokens in (1, 2, 3, 5, 8, 13, 21, 34, 64):
        for fields in ({"temperature": 0, "parallel_tool_calls": False}, {"temperature": 1.5, "seed": max_tokens}):
            seen.add(check_forced(forced(live, max_tokens=max_tokens, **fields), max_tokens))
    assert seen == {"calls", "cut"}  # both were reached: tiny budgets cut the call, larger ones made it
    r = forced(live, max_tokens=64, temperature=0, parallel_tool_calls=False)
    assert check_forced(r) == "calls" and r.json()["choices"][0]["finish_reason"] == "tool_calls"
    assert len(r.json()["choices"][0]["message"]["tool_calls"]) == 1


@pytest.mark.parametrize("server", ["demo", "generated"])
def test_a_stop_string_never_cuts_a_forced_call(server, request):
    """Stop strings end a reply's text; a forced reply is the calls alone, so one matching inside their arguments
    (here `{`, which every call's JSON starts with) must not end it with finish_reason stop and nothing in it."""
    live = request.getfixturevalue(server)
    for stop in (["{"], ["city", "\""]):
        for thinking in ({}, {"reasoning_effort": "high"}):
            r = forced(live, max_tokens=64, temperature=0, parallel_tool_calls=False, stop=stop, **thinking)
            assert check_forced(r) == "calls", r.text
            assert r.json()["choices"][0]["finish_reason"] == "tool_calls"
    body = {"model": live.name, "messages": ASK, "tools": TOOLS, "tool_choice": "required", "stream": True,
            "max_tokens": 64, "temperature": 0, "parallel_tool_calls": False, "stop": ["{"]}
    with httpx.stream("POST", live.url + "/v1/chat/completions", json=body, timeout=120) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    calls = [c for ch in chunks for c in ch["choices"][0]["delta"].get("tool_calls") or []]
    assert len(calls) == 1 and chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_the_other_dialects_forced_calls_are_calls_or_cut_off_too(demo):
    """Anthropic's tool_choice any (with stop_sequences) and Responses' required, at a tiny and a roomy budget."""
    tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]
    for max_tokens in (2, 64):
        r = httpx.post(demo.url + "/v1/messages", json={
            "model": demo.name, "messages": ASK, "tools": tools, "max_tokens": max_tokens, "temperature": 0,
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True}, "stop_sequences": ["{"]}, timeout=120)
        reply = r.json()
        assert r.status_code == 200 and reply["stop_sequence"] is None, reply
        if max_tokens == 2:
            assert reply["stop_reason"] == "max_tokens" and reply["content"] == []
        else:
            assert reply["stop_reason"] == "tool_use" and [b["type"] for b in reply["content"]] == ["tool_use"]
        r = httpx.post(demo.url + "/v1/responses", json={
            "model": demo.name, "input": ASK, "max_output_tokens": max_tokens, "temperature": 0,
            "tool_choice": "required", "parallel_tool_calls": False,
            "tools": [{"type": "function", "name": t["name"], "parameters": t["input_schema"]} for t in tools]},
            timeout=120)
        response = r.json()
        assert r.status_code == 200, response
        if max_tokens == 2:
            assert response["status"] == "incomplete" and response["output"] == []
        else:
            assert response["status"] == "completed"
            assert [i["type"] for i in response["output"]] == ["function_call"]
