"""The shipped demo model (wizard/data/demo-model, trained by demo/train.py): its files are what SHA256SUMS
says, it opens like any checkpoint, and greedy chat answers what it was trained on — in phrasings the tests
choose — with clean text that stops by itself."""
from __future__ import annotations

import hashlib
import re

import pytest

from k3core import ChatSession, EngineConfig, SamplingParams, load_tokenizer, open_engine

from .conftest import DEMO_MODEL

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
