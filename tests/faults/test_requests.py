"""Hostile request bodies to `k3 serve`, in its three dialects, over the demo model (it can chat): a schema with no
finite instance or a grammar that cannot run is a 400 naming the field before generation, never a reply that says
it is done; a grammar that fails mid-reply ends its request alone, and the request beside it in the batch gets the
ids it gets alone; an id or a name of the wrong type is a 400 naming its path, never a traceback; `metadata` is
held to OpenAI's bounds (Anthropic's: `user_id` alone); an exception no check foresaw is a JSON error in the
dialect's shape. Each row asserts the status and that the message names the field."""
from __future__ import annotations

import threading
import time

import pytest
from fastapi.testclient import TestClient

from ..conftest import DEMO_MODEL


def row(case, *values, full=False):
    return pytest.param(*values, id=case, marks=[pytest.mark.faults_full] if full else [])


@pytest.fixture(scope="module")
def server():
    """The demo model with two sequences (two requests share a pass), its worker, and a client."""
    from k3core import EngineConfig, load_tokenizer, open_engine
    from serve.api import ApiOptions
    from serve.app import build_app
    from serve.worker import EngineSlot, Worker

    engine = open_engine(EngineConfig(DEMO_MODEL, sequences=2))
    worker = Worker(EngineSlot(engine, load_tokenizer(DEMO_MODEL)), queue_size=4)
    try:
        yield worker, TestClient(build_app(worker, ApiOptions()), raise_server_exceptions=False)
    finally:
        worker.close()
        engine.close()


HI = [{"role": "user", "content": "hi"}]
SELF = {"$ref": "#"}
CYCLE = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
NO_BASE = {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}},
           "$ref": "#/$defs/n"}
NONEMPTY = {"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 1}}, "$ref": "#/$defs/n"}
BIG_PATTERN = {"type": "string", "pattern": "^a{1000000}$"}
PATTERNS_TOGETHER = {"type": "object", "required": ["x", "y"], "properties": {  # each alone builds; both do not
    "x": {"type": "string", "pattern": "^a{100000}$"}, "y": {"type": "string", "pattern": "^b{100000}$"}}}
MID_REPLY = {"anyOf": [{"type": "string", "pattern": "^a{100000}$"}, {"type": "string", "pattern": "^b{100000}$"}]}
FINITE = "no finite JSON value satisfies it"
FUEL = "its limit, initial_lexer_fuel, is 1,000,000"


def chat(schema=None, **fields):
    body = {"messages": HI, "max_tokens": 16, **fields}
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    return "/v1/chat/completions", body


def chat_tool(schema, choice="required"):
    tool_choice = choice if choice == "required" else {"type": "function", "function": {"name": "f"}}
    return chat(tools=[{"type": "function", "function": {"name": "f", "parameters": schema}}], tool_choice=tool_choice)


def responses(schema=None, **fields):
    body = {"input": "hi", "max_output_tokens": 16, **fields}
    if schema is not None:
        body["text"] = {"format": {"type": "json_schema", "name": "s", "schema": schema}}
    return "/v1/responses", body


def responses_tool(schema):
    return responses(tools=[{"type": "function", "name": "f", "parameters": schema}], tool_choice="required")


def messages(schema=None, **fields):
    body = {"messages": HI, "max_tokens": 16, **fields}
    if schema is not None:
        body["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
    return "/v1/messages", body


def messages_tool(schema, deferred_first=False):
    tools = [{"name": "g", "input_schema": {"type": "object"}, "defer_loading": True}] if deferred_first else []
    return messages(tools=tools + [{"name": "f", "input_schema": schema}], tool_choice={"type": "any"})


def error_of(r) -> tuple[str, str | None]:
    """(message, param) of an error body in either shape (Anthropic's has no param)."""
    body = r.json()
    return body["error"]["message"], body["error"].get("param")


# ---- 1. a schema with no finite instance, or a grammar that cannot run: 400 before generation ---------------------
# (request, the field named, what the message says)
SCHEMA_CASES = [
    row("chat-self-ref", chat(SELF), "response_format.json_schema.schema", FINITE),
    row("chat-cycle", chat(CYCLE), "response_format.json_schema.schema", FINITE),
    row("chat-required-tool-self-ref", chat_tool(SELF), "tools[0].function.parameters", FINITE),
    row("chat-named-tool-cycle", chat_tool(CYCLE, "named"), "tools[0].function.parameters", FINITE),
    row("responses-self-ref", responses(SELF), "text.format.schema", FINITE),
    row("responses-required-tool-cycle", responses_tool(CYCLE), "tools[0].parameters", FINITE),
    row("messages-self-ref", messages(SELF), "output_config.format.schema", FINITE),
    row("messages-any-tool-cycle", messages_tool(CYCLE), "tools[0].input_schema", FINITE),
    row("chat-object-without-a-base-case", chat(NO_BASE), "response_format.json_schema.schema",
        "the $ref '#/$defs/n' at #/$defs/n/properties/c recurses with no way out"),
    row("responses-nonempty-array-of-itself", responses(NONEMPTY), "text.format.schema",
        "the $ref '#/$defs/n' at #/$defs/n/items recurses"),
    row("chat-pattern-a{1000000}", chat(BIG_PATTERN), "response_format.json_schema.schema",
        "the pattern at #/pattern is too large to enforce"),
    row("chat-patterns-too-large-together", chat(PATTERNS_TOGETHER), "response_format.json_schema.schema",
        "its patterns are too large together"),
    row("messages-tool-after-a-deferred-one", messages_tool(SELF, deferred_first=True), "tools[1].input_schema",
        FINITE, full=True),
    row("chat-cycle-beside-auto-tools", chat(CYCLE, tools=[{"type": "function", "function": {"name": "f"}}],
                                    tool_choice="auto"), "response_format.json_schema.schema", FINITE, full=True),
    row("responses-cycle", responses(CYCLE), "text.format.schema", FINITE, full=True),
    row("responses-required-tool-self-ref", responses_tool(SELF), "tools[0].parameters", FINITE, full=True),
    row("messages-cycle", messages(CYCLE), "output_config.format.schema", FINITE, full=True),
    row("messages-any-tool-self-ref", messages_tool(SELF), "tools[0].input_schema", FINITE, full=True),
    row("messages-pattern-a{1000000}", messages(BIG_PATTERN), "output_config.format.schema", FUEL, full=True),
    row("chat-required-tool-no-base", chat_tool(NO_BASE), "tools[0].function.parameters", FINITE, full=True),
    row("chat-pattern-unclosed-group", chat({"type": "string", "pattern": "("}),
        "response_format.json_schema.schema", "the pattern at #/pattern cannot be enforced: regex parse error",
        full=True),
]


@pytest.mark.parametrize("request_, where, needle", SCHEMA_CASES)
def test_a_schema_that_cannot_be_enforced_is_refused_before_generation(server, request_, where, needle):
    worker, client = server
    route, body = request_
    before = worker.stats()["completed"]
    r = client.post(route, json={"model": "k3", **body})
    assert r.status_code == 400, r.text[:2000]
    message, param = error_of(r)
    assert message.startswith(f"{where}: ") and needle in message and "<state>" not in message, message
    assert param in (where, None)  # Anthropic's errors carry no param: the message names it
    assert worker.stats()["completed"] == before  # nothing was generated


def test_a_recursion_with_a_way_out_is_served(server):
    """The check refuses only what has no finite instance: a tree whose children are an array, a linked list ending
    in null, compile and run."""
    tree = {"$defs": {"n": {"type": "object", "required": ["c"], "properties": {
        "c": {"type": "array", "maxItems": 1, "items": {"$ref": "#/$defs/n"}}}}}, "$ref": "#/$defs/n"}
    listed = {"$defs": {"n": {"type": "object", "required": ["next"], "properties": {
        "next": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/n"}]}}}}, "$ref": "#/$defs/n"}
    for schema in (tree, listed):
        route, body = chat(schema, max_tokens=40, temperature=0)
        r = server[1].post(route, json={"model": "k3", **body})
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length"), r.text[:2000]


# ---- 2. a grammar that fails mid-reply ends its request alone ----------------------------------------------------
@pytest.mark.parametrize("stream", [row("whole", False), row("streamed", True, full=True)])
def test_a_grammar_that_fails_mid_reply_ends_its_request_alone(server, stream):
    """A schema every check passes whose grammar fails a few ids in (two patterns, each buildable alone, that
    llguidance's lexer cannot hold together) beside a long completion in the same passes: the failing request gets
    a 400 naming its schema without llguidance's state, the other the ids and log-probabilities it gets alone."""
    worker, client = server
    failing = {"model": "k3", **chat(MID_REPLY, max_tokens=32, temperature=0, stream=stream)[1]}
    other = {"model": "k3", "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "logprobs": 0}

    def check_failed(r):
        if stream:
            assert r.status_code == 200 and '"param": "response_format.json_schema.schema"' in r.text, r.text[:2000]
            text = r.text
        else:
            assert r.status_code == 400, r.text[:2000]
            message, param = error_of(r)
            assert param == "response_format.json_schema.schema", r.text[:2000]
            text = message
        assert "the grammar engine could not go on after" in text and "<state>" not in text, text[:2000]

    check_failed(client.post("/v1/chat/completions", json=failing))  # alone first (its patterns' checks are cached)
    alone = client.post("/v1/completions", json=other).json()["choices"][0]
    got = {}
    thread = threading.Thread(target=lambda: got.update(r=client.post("/v1/completions", json=other)))
    thread.start()
    deadline = time.monotonic() + 30
    while worker.stats()["active"] < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    check_failed(client.post("/v1/chat/completions", json=failing))
    assert thread.is_alive(), "the long completion ended before the failing request ran beside it"
    thread.join(60)
    assert got["r"].status_code == 200, got["r"].text[:2000]
    together = got["r"].json()["choices"][0]
    assert together["logprobs"]["tokens"] == alone["logprobs"]["tokens"]
    assert together["logprobs"]["token_logprobs"] == alone["logprobs"]["token_logprobs"]
    assert together["text"] == alone["text"] and together["finish_reason"] == "length"


# ---- 3. every id and name typed: a 400 naming its path --------------------------------------------------------
CALL = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
TOOL_F = [{"name": "f", "input_schema": {"type": "object"}}]
RESPONSE_TOOL_F = [{"type": "function", "name": "f"}]
ID_CASES = [
    row("messages-tool-result-tool-use-id-list", "/v1/messages", {"max_tokens": 4, "messages": [
        {"role": "assistant", "content": [CALL]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": ["t1"], "content": "x"}]}]},
        "messages[1].content[0].tool_use_id"),
    row("messages-tool-use-id-object", "/v1/messages", {"max_tokens": 4, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": [{**CALL, "id": {"a": 1}}]}]},
        "messages[1].content[0].id"),
    row("messages-tool-choice-name-list", "/v1/messages", {"max_tokens": 4, "messages": HI, "tools": TOOL_F,
                                                           "tool_choice": {"type": "tool", "name": ["f"]}},
        "tool_choice.name"),
    row("count-tokens-tool-choice-name-list", "/v1/messages/count_tokens", {
        "messages": HI, "tools": TOOL_F, "tool_choice": {"type": "tool", "name": ["f"]}}, "tool_choice.name"),
    row("responses-input-role-list", "/v1/responses", {"input": [{"role": ["user"], "content": "hi"}]},
        "input[0].role"),
    row("responses-function-call-output-call-id-object", "/v1/responses", {"input": [
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": {"a": 1}, "output": "x"}]}, "input[1].call_id"),
    row("responses-tool-choice-name-list", "/v1/responses", {"input": "hi", "tools": RESPONSE_TOOL_F,
                                                             "tool_choice": {"type": "function", "name": ["f"]}},
        "tool_choice.name"),
    row("chat-tool-message-tool-call-id-list", "/v1/chat/completions", {"messages": [
        {"role": "tool", "tool_call_id": ["c1"], "content": "x"}]}, "messages[0].tool_call_id"),
    row("header-tool-choice-beside-a-tool-named-by-a-list", "/v1/messages", {
        "max_tokens": 4, "messages": HI, "tools": [{"name": ["f"], "input_schema": {}}]}, "tools[0].name",
        {"x-k3-tool-choice": "any"}),
    row("chat-tool-call-id-list", "/v1/chat/completions", {"messages": [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": ["c1"], "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]},
        "messages[0].tool_calls[0].id", full=True),
    row("chat-message-name-object", "/v1/chat/completions", {"messages": [
        {"role": "user", "name": {"a": 1}, "content": "hi"}]}, "messages[0].name", full=True),
    row("chat-user-list", "/v1/chat/completions", {"messages": HI, "user": ["u"]}, "user", full=True),
    row("chat-json-schema-name-list", "/v1/chat/completions", {"messages": HI, "response_format": {
        "type": "json_schema", "json_schema": {"name": ["s"], "schema": {"type": "object"}}}},
        "response_format.json_schema.name", full=True),
    row("chat-tool-choice-name-list", "/v1/chat/completions", {"messages": HI, "tools": [
        {"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {
            "name": ["f"]}}}, "tool_choice", full=True),
    row("responses-function-call-call-id-list", "/v1/responses", {"input": [
        {"type": "function_call", "call_id": ["c1"], "name": "f", "arguments": "{}"}]}, "input[0].call_id", full=True),
    row("responses-item-id-list", "/v1/responses", {"input": [{"role": "user", "content": "hi", "id": ["m"]}]},
        "input[0].id", full=True),
    row("responses-text-format-name-list", "/v1/responses", {"input": "hi", "text": {"format": {
        "type": "json_schema", "name": ["s"], "schema": {"type": "object"}}}}, "text.format.name", full=True),
    row("responses-previous-response-id-list", "/v1/responses", {"input": "hi", "previous_response_id": ["r"]},
        "previous_response_id", full=True),
    row("messages-tool-use-name-list", "/v1/messages", {"max_tokens": 4, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": [{**CALL, "name": ["f"]}]}]},
        "messages[1].content[0].name", full=True),
]


@pytest.mark.parametrize("route, body, where, headers", [
    pytest.param(*case.values, *([{}] if len(case.values) == 3 else []), id=case.id, marks=case.marks)
    for case in ID_CASES])
def test_an_id_or_name_of_the_wrong_type_is_a_400_naming_it(server, route, body, where, headers):
    r = server[1].post(route, json={"model": "k3", **body}, headers=headers)
    assert r.status_code == 400, r.text[:2000]
    message, param = error_of(r)
    assert message.startswith(f"{where}: ") and param in (where, None), message
    assert "Traceback" not in r.text and "unhashable" not in r.text


# ---- 4. metadata bounded as OpenAI bounds it (Anthropic: user_id alone) -------------------------------------------
BIG = "x" * (3 << 20)
METADATA_CASES = [
    row("responses-3.5-MB-value", "/v1/responses", {"input": "hi", "metadata": {"k": BIG}}, "metadata.k",
        f"at most 512 characters, got {len(BIG)}"),
    row("responses-17-pairs", "/v1/responses", {"input": "hi", "metadata": {str(i): "v" for i in range(17)}},
        "metadata", "at most 16 key-value pairs, got 17"),
    row("responses-65-character-key", "/v1/responses", {"input": "hi", "metadata": {"k" * 65: "v"}}, "metadata",
        "a key is at most 64 characters, got one of 65"),
    row("chat-3.5-MB-value", "/v1/chat/completions", {"messages": HI, "metadata": {"k": BIG}}, "metadata.k",
        "at most 512 characters"),
    row("messages-3.5-MB-user-id", "/v1/messages", {"max_tokens": 4, "messages": HI, "metadata": {"user_id": BIG}},
        "metadata.user_id", "at most 256 characters"),
    row("messages-another-key", "/v1/messages", {"max_tokens": 4, "messages": HI, "metadata": {"k": "v"}},
        "metadata", "the Messages API defines `user_id` alone"),
    row("responses-value-not-a-string", "/v1/responses", {"input": "hi", "metadata": {"k": 1}}, "metadata.k",
        "must be a string", full=True),
    row("responses-not-an-object", "/v1/responses", {"input": "hi", "metadata": ["k"]}, "metadata",
        "must be an object", full=True),
    row("messages-user-id-list", "/v1/messages", {"max_tokens": 4, "messages": HI, "metadata": {"user_id": ["u"]}},
        "metadata.user_id", "must be a string", full=True),
]


@pytest.mark.parametrize("route, body, where, needle", METADATA_CASES)
def test_metadata_past_its_bounds_is_a_400_naming_it(server, route, body, where, needle):
    r = server[1].post(route, json={"model": "k3", **body})
    assert r.status_code == 400, r.text[:2000]
    message, param = error_of(r)
    assert message.startswith(f"{where}: ") and needle in message and param in (where, None), message
    assert len(r.content) < 4096  # the refusal does not echo what it refused


def test_metadata_within_its_bounds_is_kept_and_echoed(server):
    meta = {f"k{i:02d}" + "k" * 60: "v" * 512 for i in range(16)}
    r = server[1].post("/v1/responses", json={"model": "k3", "input": "hi", "max_output_tokens": 2, "metadata": meta})
    assert r.status_code == 200 and r.json()["metadata"] == meta, r.text[:2000]
    ok = server[1].post("/v1/messages", json={"model": "k3", "max_tokens": 2, "messages": HI,
                                              "metadata": {"user_id": "u" * 256}})
    assert ok.status_code == 200, ok.text[:2000]


# ---- 5. an exception no check foresaw: a JSON error in the dialect's shape --------------------------------------
def boom(*args, **kwargs):
    raise RuntimeError("an internal detail the client must not see")


@pytest.mark.parametrize("route, body, anthropic", [
    row("chat", *chat(), False),
    row("messages", *messages(), True),
    row("responses", *responses(), False, full=True),
    row("chat-stream-asked", *chat(stream=True), False, full=True),
])
def test_an_unforeseen_exception_is_a_json_error_in_the_dialect_shape(server, monkeypatch, route, body, anthropic):
    import serve.api

    monkeypatch.setattr(serve.api.Api, "breakpoint_positions", boom)  # runs as the job is made, past every check
    r = server[1].post(route, json={"model": "k3", **body})
    assert r.status_code == 500 and "internal detail" not in r.text and "Traceback" not in r.text, r.text[:2000]
    error = r.json()["error"]
    assert r.json() == ({"type": "error", "error": {"type": "api_error", "message": error["message"]}} if anthropic
                        else {"error": {**error, "type": "server_error", "code": "internal_error"}})
    assert "the server failed on this request (RuntimeError)" in error["message"]


@pytest.mark.parametrize("module, route, body, event", [
    row("chat", "chat_completions", *chat(stream=True), '"code": "internal_error"'),
    row("messages", "anthropic", *messages(stream=True), '"type": "api_error"', full=True),
    row("responses", "responses", *responses(stream=True), '"code": "internal_error"', full=True),
])
def test_an_unforeseen_exception_mid_stream_is_an_error_event(server, monkeypatch, module, route, body, event):
    import importlib

    monkeypatch.setattr(importlib.import_module(f"serve.{module}"), "chat_reply", boom)  # at the reply's end
    r = server[1].post(route, json={"model": "k3", **body})
    assert r.status_code == 200 and event in r.text and "(RuntimeError)" in r.text, r.text[-2000:]
    assert "internal detail" not in r.text
