"""Fixtures for the browser UI's tests: `k3 ui` flags, one EngineHost on the small test model, a
way to slow the engine down (so a stop lands mid-reply), and reference replies from a fresh
ChatSession on its own engine (what every UI turn must reproduce exactly)."""
from __future__ import annotations

import argparse
import contextlib
import time

import pytest

from k3core.generation.chat_session import ChatSession
from k3core import EngineConfig, open_engine
from k3core.cli.options import engine_config_from_args
from k3core.generation.sampling import SamplingParams
from k3core.text.tokenizer import load_tokenizer

GREEDY = SamplingParams(max_tokens=6)  # short greedy replies: the random test model stays in plain text


def ui_args(model, *extra):
    """`k3 ui MODEL …` parsed: (EngineConfig, ServerOptions), as ui.plugin hands them to serve()."""
    from ui.plugin import add_parser, server_options

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["ui", str(model), *map(str, extra)])
    return engine_config_from_args(args), server_options(args)


@pytest.fixture(scope="session")
def host(small_model):
    from ui.host import EngineHost

    h = EngineHost(ui_args(small_model)[0])
    yield h
    h.close()


@contextlib.contextmanager
def on_each_layer(engine, call):
    """Run `call()` as the engine's placer hands out each layer (from inside the forward pass)."""
    placer = engine.placer
    layer = placer.layer
    placer.layer = lambda L: (call(), layer(L))[1]
    try:
        yield
    finally:
        del placer.layer


def slowed(engine, seconds_per_layer: float):
    """Make every layer take at least this long."""
    return on_each_layer(engine, lambda: time.sleep(seconds_per_layer))


@pytest.fixture(scope="session")
def reference(small_model):
    """reference(turns, mode="instruct", params=GREEDY) -> each turn's (thinking, answer) from a fresh
    ChatSession on a separate engine."""
    engine, tok = open_engine(EngineConfig(small_model)), load_tokenizer(small_model)

    def run(turns, mode="instruct", params=GREEDY, system=None):
        chat, out = ChatSession(engine, tok, mode, system), []
        for text in turns:
            for _ in chat.ask(text, params):
                pass
            out.append((chat.last["thinking"], chat.last["answer"]))
        return out

    yield run
    engine.close()
