"""The shipped demo model (wizard/data/demo-model, trained by demo/train.py): its files are what SHA256SUMS
says, it opens like any checkpoint, and greedy chat answers what it was trained on — in phrasings the tests
choose — with clean text that stops by itself. Sampled at temperature 1 as clients ask, a reply held to a person
schema and a forced call of a person tool (names the corpus never declares) close with a short name and an age;
with tools declared and none forced, it calls get_weather for the weather and answers a capital itself."""
from __future__ import annotations

import hashlib
import json
import re

import pytest

from k3core import (ChatSession, Conversation, EngineConfig, SamplingParams, Session, chat_grammar, load_tokenizer,
                    open_engine)
from k3core.text.chat import build_ids, forced_tool_prefix, parse_tool_calls, render, split_reply

from ..conftest import DEMO_MODEL

QUESTIONS = [  # (question, what the answer must contain)
    ("What is the capital of France?", "Paris"),
    ("Which city is the capital of Japan?", "Tokyo"),
    ("capital of Kenya?", "Nairobi"),
    ("What is 7 + 5?", "12"),
    ("What is 9 - 4?", "5"),
    ("What is the opposite of hot?", "old"),
    ("What colour is the sky?", "blue"),
    ("Hello", "Hello"),
    ("Who are you?", "not Kimi K3"),
    ("What is the meaning of life?", "I don't know"),
]


def test_the_shipped_files_are_what_sha256sums_says():
    listed = {}
    for line in (DEMO_MODEL / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ")
        listed[name] = digest
    assert set(listed) == {p.name for p in DEMO_MODEL.iterdir()} - {"SHA256SUMS"}
    for name, digest in listed.items():
        assert hashlib.sha256((DEMO_MODEL / name).read_bytes()).hexdigest() == digest, name
    assert sum((DEMO_MODEL / n).stat().st_size for n in listed) < 5e6


@pytest.fixture(scope="module")
def chat():
    with open_engine(EngineConfig(DEMO_MODEL)) as engine:
        yield engine, load_tokenizer(DEMO_MODEL)


@pytest.mark.parametrize("question, want", QUESTIONS)
def test_greedy_chat_answers_and_stops_cleanly(chat, question, want):
    engine, tok = chat
    session = ChatSession(engine, tok)
    for _ in session.ask(question, SamplingParams(max_tokens=60)):
        pass
    answer = session.last["answer"]
    assert want in answer, (question, answer)
    assert session.last["reason"] == "stop id"  # it ends its reply, well before the limit
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]|<\|\w+\|>|\[EOS\]|\ufffd", answer), answer


PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def a_person(value) -> bool:
    """What a client asking for a person can use: a short name and a plausible age."""
    return (isinstance(value, dict) and isinstance(value.get("name"), str) and 0 < len(value["name"]) <= 40
            and type(value.get("age")) is int and 0 <= value["age"] < 130)


@pytest.mark.parametrize("seed", range(3))
def test_a_reply_held_to_a_person_schema_closes_at_temperature_1(chat, seed):
    engine, tok = chat
    conv = Conversation(tok)
    conv.add_user("Invent a person.")
    params = SamplingParams(temperature=1.0, seed=seed, max_tokens=60, json_schema=PERSON)
    done = list(Session(engine, tok).generate(conv.prompt(), params, stop_ids=conv.stop_ids, channel="response"))[-1]
    text = split_reply(done.ids, tok).content
    assert done.reason == "stop id" and a_person(json.loads(text)), text


@pytest.mark.parametrize("seed, tool_choice", [(0, "required"), (1, "store_person")])
def test_a_forced_call_of_a_tool_never_trained_on_closes_at_temperature_1(chat, seed, tool_choice):
    engine, tok = chat
    tools = [{"name": "store_person", "description": "Store one person.", "parameters": PERSON}]
    forced = build_ids(tok, forced_tool_prefix("instruct", None if tool_choice == "required" else tool_choice))
    prompt = render([{"role": "user", "content": "Invent a person."}], tok, tools=tools) + forced
    grammar = chat_grammar(tok, "response", tools=tools, tool_choice=tool_choice)
    done = list(Session(engine, tok).generate(prompt, SamplingParams(temperature=1.0, seed=seed, max_tokens=80),
                                              stop_ids=grammar.stop_ids, grammar=grammar))[-1]
    calls = parse_tool_calls(tok.decode(forced + done.ids))
    assert done.reason == "stop id" and len(calls) == 1 and calls[0].complete, calls
    assert calls[0].name == "store_person" and a_person(calls[0].arguments), calls


@pytest.mark.parametrize("question, call", [("What is the weather in Lima?", {"city": "Lima"}),
                                            ("What is the capital of Peru?", None)])
def test_with_tools_declared_it_calls_one_only_when_the_question_needs_it(chat, question, call):
    engine, tok = chat
    prompt = render([{"role": "user", "content": question}], tok, tools=[WEATHER])
    done = list(Session(engine, tok).generate(prompt, SamplingParams(max_tokens=60),
                                              stop_ids=[tok.id_of("<|end_of_msg|>")]))[-1]
    reply = split_reply(done.ids, tok)
    calls = [(c.name, c.arguments) for c in parse_tool_calls(reply.tools or "")]
    assert calls == ([("get_weather", call)] if call else []), reply
    assert call or "Lima" in reply.content, reply
