"""Structured outputs over HTTP, with the official clients: the `openai` SDK's `.parse()` with a pydantic model
(chat completions and Responses), `response_format` json_schema / json_object, the `anthropic` SDK's
`output_config.format`; streamed and whole replies alike; a reply cut off mid-JSON says `length`; the same ids
alone and in a batch of four, with and without drafts verified by the server."""
from __future__ import annotations

import json
from typing import Literal

import anthropic
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from k3core import Speculation
from k3core.generation.generate import AUTO_K
from k3core.plugins.drafts import NgramDraft
from k3core.testing.schemas import SCHEMAS

from .conftest import Live, chat_together

BY_NAME = {name: schema for name, _, schema in SCHEMAS}
PARIS = [{"role": "user", "content": "What is the capital of France?"}]


class City(BaseModel):
    name: str = Field(max_length=16)
    country: Literal["France", "Italy", "Spain"]
    population: int = Field(ge=0, le=10 ** 9)


class Country(BaseModel):
    country: Literal["France", "Italy", "Spain"]
    has_coast: bool


def schema_format(name: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": BY_NAME[name], "strict": True}}


def test_openai_parse_with_a_pydantic_model_on_chat_completions_and_responses(demo):
    chat = demo.client.chat.completions.parse(model=demo.name, messages=PARIS, response_format=City, max_tokens=120,
                                              temperature=0)
    assert chat.choices[0].finish_reason == "stop" and isinstance(chat.choices[0].message.parsed, City)
    resp = demo.client.responses.parse(model=demo.name, input=PARIS, text_format=City, max_output_tokens=120,
                                       temperature=0)
    assert resp.status == "completed" and resp.output_parsed == chat.choices[0].message.parsed


@pytest.mark.parametrize("name", ["one_of_tagged", "array_of_objects", "string_pattern", "ref_defs"])
def test_a_streamed_reply_is_the_whole_reply_and_validates(demo, name):
    ask = dict(model=demo.name, messages=PARIS, response_format=schema_format(name), max_tokens=300, temperature=0)
    whole = demo.client.chat.completions.create(**ask).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in demo.client.chat.completions.create(**ask, stream=True)
                       if c.choices)
    assert streamed == whole
    jsonschema.validate(json.loads(whole), BY_NAME[name])


def test_json_object_gives_an_object(demo):
    r = demo.client.chat.completions.create(model=demo.name, messages=PARIS, max_tokens=300, temperature=0,
                                            response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # any object may run on: then it is cut off and says so
        assert r.choices[0].finish_reason == "length" and r.choices[0].message.content.startswith("{")


def test_a_reply_cut_off_mid_json_says_length_and_parse_refuses_it(demo):
    r = demo.client.chat.completions.create(model=demo.name, messages=PARIS, max_tokens=5, temperature=0,
                                            response_format=schema_format("array_of_objects"))
    assert r.choices[0].finish_reason == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.choices[0].message.content)
    with pytest.raises(openai.LengthFinishReasonError):
        demo.client.chat.completions.parse(model=demo.name, messages=PARIS, response_format=City, max_tokens=5)


def test_anthropic_output_config_format(demo):
    c = anthropic.Anthropic(base_url=demo.url, api_key="none", max_retries=0, timeout=120)
    r = c.messages.create(model=demo.name, max_tokens=300, messages=PARIS, extra_body={"temperature": 0},
                          output_config={"format": {"type": "json_schema", "schema": BY_NAME["tool_arguments"]}})
    assert r.stop_reason == "end_turn"
    jsonschema.validate(json.loads(r.content[0].text), BY_NAME["tool_arguments"])
    # the SDK moves bounds (maxLength, maximum) into descriptions before sending: a model with none to lose
    parsed = c.messages.parse(model=demo.name, max_tokens=300, messages=PARIS, output_format=Country)
    assert parsed.stop_reason == "end_turn" and isinstance(parsed.parsed_output, Country)


def test_a_schema_that_cannot_be_enforced_is_a_400_naming_it(demo):
    with pytest.raises(openai.BadRequestError) as e:
        demo.client.chat.completions.create(model=demo.name, messages=PARIS, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}}})
    assert e.value.body["param"] == "response_format.json_schema.schema"
    assert "uniqueItems" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        demo.client.chat.completions.create(model=demo.name, messages=PARIS, max_tokens=8,
                                            response_format={"type": "json_schema", "json_schema": "x"})
    assert e.value.body["param"] == "response_format.json_schema"


def test_the_same_ids_alone_in_a_batch_of_four_and_with_drafts(model_factory):
    """Four sampled requests with four schemas at once, on a server that verifies ngram drafts: each reply is
    the one a plain server gives it alone."""
    names = ["one_of_tagged", "array_of_objects", "tuple", "tool_arguments"]
    asks = [dict(messages=[{"role": "user", "content": f"{n} please"}], response_format=schema_format(n),
                 max_tokens=300, temperature=1.0, seed=3) for n in names]
    plain = Live(model_factory("small"), sequences=1)
    try:
        want = [plain.client.chat.completions.create(model=plain.name, **a).choices[0].message.content for a in asks]
    finally:
        plain.close()
    for name, text in zip(names, want):
        jsonschema.validate(json.loads(text), BY_NAME[name])
    live = Live(model_factory("small"), sequences=4, speculate=AUTO_K)
    live.worker.speculation = lambda: Speculation(NgramDraft(None), AUTO_K, adaptive=True)
    try:
        assert chat_together(live, asks) == want
    finally:
        live.close()


WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                             "parameters": BY_NAME["tool_arguments"]}},
           {"type": "function", "function": {"name": "get_time", "description": "the time in a city",
                                             "parameters": BY_NAME["nested_objects"]}}]


@pytest.mark.parametrize("thinking", [False, True], ids=["instruct", "thinking"])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_a_forced_tool_call_on_the_demo_model_validates(demo, choice, thinking):
    """One call (parallel_tool_calls false: the demo model, once calling, would go on calling to max_tokens)."""
    r = demo.client.chat.completions.create(model=demo.name, messages=[{"role": "user", "content": "Weather in Rome?"}],
                                            tools=WEATHER, tool_choice=choice, max_tokens=300, temperature=0,
                                            reasoning_effort="high" if thinking else "none", parallel_tool_calls=False)
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and len(calls) == 1
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in WEATHER}
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    if isinstance(choice, dict):
        assert [c.function.name for c in calls] == ["get_time"]


def test_tools_offered_with_a_schema_give_a_valid_answer_or_valid_calls(demo):
    for question in ("Weather in Rome?", "What is the capital of France?", "Hello!"):
        r = demo.client.chat.completions.create(model=demo.name, messages=[{"role": "user", "content": question}],
                                                tools=WEATHER, max_tokens=300, temperature=0,
                                                response_format=schema_format("enum_in_object"))
        message = r.choices[0].message
        if message.tool_calls:
            assert r.choices[0].finish_reason == "tool_calls" and not message.content
            for call in message.tool_calls:
                jsonschema.validate(json.loads(call.function.arguments), BY_NAME["tool_arguments"]
                                    if call.function.name == "get_weather" else BY_NAME["nested_objects"])
        else:
            assert r.choices[0].finish_reason == "stop"
            jsonschema.validate(json.loads(message.content), BY_NAME["enum_in_object"])


def test_parallel_calls_off_means_one_call_in_every_dialect(demo):
    """Tools offered under auto with parallel calls off: the reply is text, or text and one call, validated."""
    ask = [{"role": "user", "content": "Weather in Rome and in Paris?"}]
    r = demo.client.chat.completions.create(model=demo.name, messages=ask, tools=WEATHER, max_tokens=300,
                                            temperature=0, tool_choice="required", parallel_tool_calls=False)
    assert len(r.choices[0].message.tool_calls) == 1
    c = anthropic.Anthropic(base_url=demo.url, api_key="none", max_retries=0, timeout=120)
    tools = [{"name": "get_weather", "input_schema": BY_NAME["tool_arguments"]}]
    m = c.messages.create(model=demo.name, max_tokens=300, messages=ask, tools=tools,
                          tool_choice={"type": "any", "disable_parallel_tool_use": True})
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and len(uses) == 1
    jsonschema.validate(uses[0].input, BY_NAME["tool_arguments"])
    for question in ("Weather in Rome?", "Hello!"):
        r = demo.client.chat.completions.create(model=demo.name, messages=[{"role": "user", "content": question}],
                                                tools=WEATHER, max_tokens=300, temperature=0, parallel_tool_calls=False)
        calls = r.choices[0].message.tool_calls or []
        assert len(calls) <= 1 and r.choices[0].finish_reason == ("tool_calls" if calls else "stop"), question
        for call in calls:
            json.loads(call.function.arguments)


def test_responses_echo_the_format_and_hold_parallel_calls_off_to_one(demo):
    tools = [{"type": "function", "name": "get_weather", "parameters": BY_NAME["tool_arguments"]}]
    r = demo.client.responses.create(model=demo.name, input="Weather in Rome and Paris?", tools=tools,
                                     tool_choice="required", parallel_tool_calls=False, max_output_tokens=300,
                                     temperature=0)
    calls = [item for item in r.output if item.type == "function_call"]
    assert r.parallel_tool_calls is False and len(calls) == 1
    jsonschema.validate(json.loads(calls[0].arguments), BY_NAME["tool_arguments"])
    fmt = {"type": "json_schema", "name": "colour", "schema": BY_NAME["enum_in_object"], "strict": True}
    r = demo.client.responses.create(model=demo.name, input="A colour?", text={"format": fmt}, max_output_tokens=100,
                                     temperature=0)
    assert r.text.format.type == "json_schema" and r.text.format.name == "colour"
    jsonschema.validate(json.loads(r.output_text), BY_NAME["enum_in_object"])


def test_the_turn_after_a_forced_call_resumes_from_the_prompt_cache(demo):
    """A forced tool call, then its result sent back (chat completions and Responses): the follow-up reads the first
    request's prompt from the prompt cache, all but its last id (the call's arguments re-render otherwise than the
    model wrote them, so the kept reply's state is not a prefix of the follow-up)."""
    ask = [{"role": "user", "content": "Weather in Oslo, as asked only here?"}]
    r = demo.client.chat.completions.create(model=demo.name, messages=ask, tools=WEATHER, tool_choice="required",
                                            max_tokens=300, temperature=0, parallel_tool_calls=False)
    call = r.choices[0].message.tool_calls[0]
    follow = [*ask, r.choices[0].message.model_dump(exclude_none=True),
              {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    again = demo.client.chat.completions.create(model=demo.name, messages=follow, tools=WEATHER, max_tokens=2,
                                                temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens - 1
    first = demo.client.responses.create(model=demo.name, input="Weather in Lima, as asked only here?",
                                         tools=RESPONSES_WEATHER, tool_choice="required", max_output_tokens=300,
                                         temperature=0, parallel_tool_calls=False)
    calls = [item for item in first.output if item.type == "function_call"]
    then = demo.client.responses.create(model=demo.name, previous_response_id=first.id, tools=RESPONSES_WEATHER,
                                        input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                                "output": "rain"}], max_output_tokens=2, temperature=0)
    assert then.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1


RESPONSES_WEATHER = [{"type": "function", **t["function"]} for t in WEATHER]
