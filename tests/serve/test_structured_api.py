"""Structured outputs over HTTP, with the official clients: the `openai` SDK's `.parse()` with a pydantic model
(chat completions and Responses), `response_format` json_schema / json_object, the `anthropic` SDK's
`output_config.format`; streamed and whole replies alike; a reply cut off mid-JSON says `length`; the same ids
alone and in a batch of four, with and without drafts verified by the server."""
from __future__ import annotations

import json
import threading
from typing import Literal

import anthropic
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from k3core import AUTO_K, Speculation
from k3core.plugins.drafts import NgramDraft
from k3core.testing.schemas import SCHEMAS

from .conftest import Live

BY_NAME = {name: schema for name, _, schema in SCHEMAS}
PARIS = [{"role": "user", "content": "What is the capital of France?"}]


class City(BaseModel):
    name: str = Field(max_length=16)
    country: Literal["France", "Italy", "Spain"]
    population: int = Field(ge=0, le=10 ** 9)


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
        got = [None] * len(asks)

        def send(i):
            got[i] = live.client.chat.completions.create(model=live.name, **asks[i]).choices[0].message.content

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(asks))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == want
    finally:
        live.close()
