"""The live servers the API tests talk to (`Live`), one per test module: `demo` serves the shipped demo model,
`generated` a random `small` model with four sequences (tool calls come from a scripted sampler there:
`script_tool_calls`); `burst` sends requests together."""
import socket

import openai
import pytest

from k3core import EngineConfig, PrefixCache, load_tokenizer, open_engine
from serve.api import ApiOptions
from serve.app import build_app
from serve.http import listen
from serve.worker import EngineSlot, Worker

from ..conftest import DEMO_MODEL

KEY = "k3-test-key-0123456789abcdef"


class Live:
    """A server on a free loopback port over its own engine."""

    def __init__(self, model, sequences=4, queue_size=16, api_key=None, max_body_bytes=4 << 20, cache_dir=None,
                 **fields):
        """`cache_dir`: the prompt cache's disk tier (else it is in RAM only)."""
        self.engine = open_engine(EngineConfig(model, sequences=sequences, **fields))
        tokenizer = load_tokenizer(model)
        self.cache = PrefixCache(self.engine, 1 << 30, interval=256, boundaries=[tokenizer.id_of("<|end_of_msg|>")],
                                 disk_dir=cache_dir, disk_bytes=1 << 30)
        self.slot = EngineSlot(self.engine, tokenizer, self.cache)
        self.worker = Worker(self.slot, queue_size=queue_size)
        self.name = model.name
        app = build_app(self.worker, ApiOptions(api_key, max_body_bytes, 64, 0))
        self.running = listen(app, "127.0.0.1", free_port())
        self.url = self.running.url
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key=api_key or "none", max_retries=0, timeout=120)

    def close(self):
        self.running.close()
        self.worker.close()
        self.engine.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def demo():
    live = Live(DEMO_MODEL)
    yield live
    live.close()


@pytest.fixture(scope="module")
def generated(model_factory):
    live = Live(model_factory("small"), sequences=4)
    yield live
    live.close()


CALLS = [("get_weather", {"city": "Paris", "days": 2}), ("get_weather", {"city": "Rome"})]


def script_tool_calls(monkeypatch, live, calls=CALLS) -> list[int]:
    """The worker's sampler replaced by one that picks, id by id, a reply saying "Checking." and calling `calls`
    ([(name, arguments)]) on `live`'s model; returns those ids."""
    from k3core import Sampler
    from k3core.text.chat import tool_call_markup
    import serve.worker

    script = live.slot.tokenizer.encode("Checking.<|close|>response<|sep|><|open|>tools<|sep|>"
                                        + tool_call_markup(calls) + "<|close|>tools<|sep|><|end_of_msg|>",
                                        allow_special=True)

    class Scripted(Sampler):
        def pick(self, logits, history=()):
            picked = self.__dict__.setdefault("picked", [])
            picked.append(script[len(picked)])
            return picked[-1]

    monkeypatch.setattr(serve.worker, "Sampler", Scripted)
    return script


def chat_together(live, asks: list[dict]) -> list[str]:
    """The reply contents of chat completions asking `asks` (create() keyword arguments), all in flight at once."""
    import threading

    got = [None] * len(asks)

    def send(i):
        got[i] = live.client.chat.completions.create(model=live.name, **asks[i]).choices[0].message.content

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(asks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def burst(live, path: str, body: dict, n: int = 4) -> list:
    """`n` POSTs of `body` to `path`, started 50 ms apart and in flight together: their responses."""
    import threading
    import time

    import httpx

    results = []
    threads = [threading.Thread(target=lambda: results.append(httpx.post(live.url + path, json=body, timeout=120)))
               for _ in range(n)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join()
    return results
