"""`k3 serve MODEL --bench N`: what concurrency buys, measured over HTTP on a loopback port.

Each of N chat requests is first served alone, one after another, then all N at once; every reply is
streamed (SSE) and greedy, with a fixed length. Printed: each way's aggregate generated tokens per second,
their ratio, and whether every concurrent reply was byte-identical to the same request served alone.
Not a test: it measures and prints.
"""
from __future__ import annotations

import json
import threading
import time

TOPICS = ("the sea", "bread", "a clock", "rivers", "the moon", "salt", "trains", "winter")


def _stream(url: str, model: str, topic: str, max_tokens: int) -> tuple[str, int]:
    import httpx

    body = {"model": model, "messages": [{"role": "user", "content": f"Tell me about {topic}."}], "stream": True,
            "temperature": 0, "max_tokens": max_tokens, "stream_options": {"include_usage": True}}
    text, tokens = [], 0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=None) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                text.append(choice["delta"].get("content") or "")
    return "".join(text), tokens


def run_bench(config, concurrent: int, max_tokens: int) -> dict:
    from k3core import load_tokenizer, open_engine

    from .api import ApiOptions
    from .app import build_app
    from .http import listen, model_id
    from .worker import EngineSlot, Worker

    engine = open_engine(config.replace(sequences=max(concurrent, config.sequences), prompt_cache_gb=0.0))
    # no prompt cache: every request forwards its whole prompt, alone or not
    worker = Worker(EngineSlot(engine, load_tokenizer(config.tokenizer or config.model)), queue_size=concurrent)
    running = listen(build_app(worker, ApiOptions()), "127.0.0.1", 0)
    try:
        url, model = running.url, model_id(config.model)
        topics = [TOPICS[i % len(TOPICS)] for i in range(concurrent)]
        _stream(url, model, topics[0], 2)  # warm up: first-touch costs out of both measurements
        alone, alone_seconds = [], 0.0
        for topic in topics:
            started = time.perf_counter()
            alone.append(_stream(url, model, topic, max_tokens))
            alone_seconds += time.perf_counter() - started
        together: list = [None] * concurrent
        passes = engine.forward_passes
        threads = [threading.Thread(target=lambda i=i: together.__setitem__(i, _stream(url, model, topics[i], max_tokens)))
                   for i in range(concurrent)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        together_seconds = time.perf_counter() - started
        tokens = sum(n for _, n in alone)
        return {"model": str(config.model), "concurrent": concurrent, "max_tokens": max_tokens,
                "tokens": tokens, "alone_seconds": alone_seconds, "together_seconds": together_seconds,
                "alone_tokens_per_second": tokens / alone_seconds,
                "together_tokens_per_second": sum(n for _, n in together) / together_seconds,
                "speedup": alone_seconds / together_seconds * sum(n for _, n in together) / tokens,
                "together_forward_passes": engine.forward_passes - passes,
                "identical": [a == b for a, b in zip(alone, together)]}
    finally:
        running.close()
        worker.close()
        engine.close()


def bench_text(r: dict) -> str:
    same = "every reply byte-identical to the same request alone" if all(r["identical"]) else \
        f"DIFFERENT replies: {r['identical']}"
    return (f"{r['concurrent']} streaming chat requests of {r['max_tokens']} tokens, greedy, on {r['model']}:\n"
            f"  one after another: {r['alone_tokens_per_second']:.2f} tokens/s in all ({r['alone_seconds']:.1f} s)\n"
            f"  all at once:       {r['together_tokens_per_second']:.2f} tokens/s in all ({r['together_seconds']:.1f} s, "
            f"{r['together_forward_passes']} forward passes)\n"
            f"  = {r['speedup']:.2f}x the aggregate rate; {same}")
