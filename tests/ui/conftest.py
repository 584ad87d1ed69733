"""Fixtures for the browser UI's tests: `k3 ui` flags, one EngineHost on the small test model, a
way to slow the engine down (so a stop lands mid-reply), and reference replies from a fresh
ChatSession on its own engine (what every UI turn must reproduce exactly)."""
from __future__ import annotations

import argparse
import contextlib
import time

import pytest

from k3core.text.chat_session import ChatSession
from k3core.model.engine import Engine
from k3core.text.sampling import SamplingParams
from k3core.text.tokenizer import load_tokenizer

GREEDY = SamplingParams(max_tokens=6)  # short greedy replies: the random test model stays in plain text


def ui_args(model, *extra):
    from ui.plugin import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    return parser.parse_args(["ui", str(model), *map(str, extra)])


@pytest.fixture(scope="session")
def host(small_model):
    from ui.host import EngineHost

    h = EngineHost(ui_args(small_model))
    yield h
    h.close()


@contextlib.contextmanager
def slowed(engine, seconds_per_layer: float):
    """Make every layer take at least this long (the UI chains its own progress hook to this one)."""
    old = engine.on_layer
    engine.on_layer = lambda layer, layers: time.sleep(seconds_per_layer)
    try:
        yield
    finally:
        engine.on_layer = old


@pytest.fixture(scope="session")
def reference(small_model):
    """reference(turns, mode="instruct", params=GREEDY) -> each turn's (thinking, answer) from a fresh
    ChatSession on a separate engine."""
    engine, tok = Engine(small_model), load_tokenizer(small_model)

    def run(turns, mode="instruct", params=GREEDY, system=None):
        chat, out = ChatSession(engine, tok, mode, system), []
        for text in turns:
            for _ in chat.ask(text, params):
                pass
            out.append((chat.last["thinking"], chat.last["answer"]))
        return out

    yield run
    engine.close()
