"""Log-probabilities (k3core/generation/logprobs.py, served by serve/logprobs.py): through the official `openai` client,
equal to the last bit to a float64 log-softmax of `Engine.logits` recomputed here, and the same bits at two
memory budgets, on two kernel backends, with speculation and in a batch."""
from __future__ import annotations

import math

import httpx
import numpy as np
import openai
import pytest

from k3core import (BatchGenerator, EngineConfig, Sampler, SamplingParams, generate_ids, greedy_ids, load_tokenizer,
                    open_engine, speculation, token_logprobs)
from k3core.io.pack import pack as pack_trunk
from k3core.text.chat import render as render_chat
from k3core.generation.logprobs import det_log
from k3core.generation.sampling import det_exp
from serve.logprobs import chat_logprobs, piece

from ..conftest import DEMO_MODEL
from .conftest import Live
from .test_openai_api import PARIS

PROMPT = "The capital of France"


def log_softmax_at(row: np.ndarray, token: int) -> float:
    """The documented definition, written out: float64, m = max, S = fsum of det_exp(x - m), minus det_log(S)."""
    x = row.astype(np.float64)
    m = x.max()
    return float((x[token] - m) - det_log(math.fsum(det_exp(x - m).tolist())))


def expected_top(row: np.ndarray, n: int) -> list[int]:
    return [int(i) for i in np.lexsort((np.arange(row.size), -row.astype(np.float64)))[:n]]


@pytest.fixture(scope="module")
def reference():
    """Another engine on the demo model (scalar kernels) and its tokenizer: the logits the numbers come from."""
    with open_engine(EngineConfig(DEMO_MODEL, kernels="scalar")) as engine:
        yield engine, load_tokenizer(DEMO_MODEL)


def test_det_log_is_a_log_and_a_row_sums_to_one():
    for s in (1.0, 1.5, 2.0, math.sqrt(2), 768.0, 163840.0, 12345.678, 1e-300, 1e300):
        assert abs(det_log(s) - math.log(s)) <= 2 * math.ulp(math.log(s) or 1.0), s
    row = (np.random.default_rng(0).standard_normal(4096) * 7).astype(np.float32)
    every = token_logprobs(row, 0, top=row.size)
    assert math.isclose(math.fsum(math.exp(lp) for _, lp in every.top), 1.0, abs_tol=1e-12)
    x = row.astype(np.float64)
    libm = x[0] - x.max() - math.log(math.fsum(np.exp(x - x.max())))
    assert every.logprob == log_softmax_at(row, 0) and abs(every.logprob - libm) < 1e-12
    tied = np.array([1, 3, 3, 2, 3], np.float32)
    assert [t for t, _ in token_logprobs(tied, 0, top=4).top] == [1, 2, 4, 3]


def test_chat_logprobs_are_the_log_softmax_of_engine_logits(demo, reference):
    engine, tokenizer = reference
    r = demo.client.chat.completions.create(model=demo.name, messages=PARIS, temperature=0, logprobs=True,
                                            top_logprobs=5)
    content = r.choices[0].logprobs.content
    assert r.choices[0].message.content == "The capital of France is Paris."
    assert len(content) == r.usage.completion_tokens
    prompt = render_chat(PARIS, tokenizer, "instruct")
    ids = greedy_ids(engine, prompt, len(content))[0]
    rows = engine.logits(prompt + ids[:-1])[len(prompt) - 1:]  # rows[i] predicts ids[i]
    for entry, token, row in zip(content, ids, rows):
        text, raw = piece(tokenizer, token)
        assert (entry.token, entry.bytes) == (text, raw)
        assert entry.logprob == log_softmax_at(row, token)  # to the last bit
        top = expected_top(row, 5)
        assert [piece(tokenizer, t)[0] for t in top] == [t.token for t in entry.top_logprobs]
        assert [log_softmax_at(row, t) for t in top] == [t.logprob for t in entry.top_logprobs]
    streamed = [e for c in demo.client.chat.completions.create(model=demo.name, messages=PARIS, temperature=0,
                                                               logprobs=True, top_logprobs=5, stream=True)
                if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert streamed == content


def test_completion_logprobs_with_echo_score_the_prompt(demo, reference):
    engine, tokenizer = reference
    r = demo.client.completions.create(model=demo.name, prompt=PROMPT, logprobs=3, echo=True, max_tokens=4,
                                       temperature=0)
    lp, prompt = r.choices[0].logprobs, tokenizer.encode(PROMPT)
    assert len(lp.tokens) == len(prompt) + 4 and r.choices[0].text.startswith(PROMPT)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    ids = prompt + greedy_ids(engine, prompt, 4)[0]
    rows = engine.logits(ids[:-1])  # teacher-forced: rows[i] predicts ids[i + 1]
    assert lp.tokens == [piece(tokenizer, t)[0] for t in ids]
    assert lp.token_logprobs[1:] == [log_softmax_at(row, t) for row, t in zip(rows, ids[1:])]
    assert [list(d) for d in lp.top_logprobs[1:]] == [[piece(tokenizer, t)[0] for t in expected_top(row, 3)]
                                                      for row in rows]
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(ids))]
    chunks = list(demo.client.completions.create(model=demo.name, prompt=PROMPT, logprobs=3, echo=True, max_tokens=4,
                                                 temperature=0, stream=True))
    assert [t for c in chunks for t in c.choices[0].logprobs.token_logprobs] == lp.token_logprobs
    assert [o for c in chunks for o in c.choices[0].logprobs.text_offset] == lp.text_offset
    plain = demo.client.completions.create(model=demo.name, prompt=PROMPT, logprobs=0, max_tokens=4, temperature=0)
    assert plain.choices[0].logprobs.token_logprobs == lp.token_logprobs[len(prompt):]
    assert plain.choices[0].logprobs.top_logprobs == [{}] * 4


def test_an_id_that_is_not_utf8_alone_gives_its_raw_bytes(reference):
    _, tokenizer = reference
    token = next(t for t in range(tokenizer.n_ranks) if not _is_utf8(tokenizer.token_bytes(t)))
    raw = tokenizer.token_bytes(token)
    entry = chat_logprobs(tokenizer, [token_logprobs(np.zeros(768, np.float32), token, top=1)])["content"][0]
    assert entry["bytes"] == list(raw) and "\ufffd" in entry["token"]
    assert entry["token"] == raw.decode("utf-8", errors="replace")


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@pytest.mark.parametrize("route, body, param, says", [
    ("chat/completions", {"messages": PARIS, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "0..20"),
    ("chat/completions", {"messages": PARIS, "top_logprobs": 2}, "top_logprobs", '"logprobs": true'),
    ("chat/completions", {"messages": PARIS, "logprobs": 3}, "logprobs", "true or false"),
    ("completions", {"prompt": PROMPT, "logprobs": 6}, "logprobs", "0..5"),
    ("completions", {"prompt": PROMPT, "logprobs": True}, "logprobs", "an integer"),
])
def test_out_of_range_logprobs_are_a_400_naming_the_field(demo, route, body, param, says):
    r = httpx.post(f"{demo.url}/v1/{route}", json={"model": demo.name, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert says in r.json()["error"]["message"]


def test_the_openai_client_gets_the_400_for_top_logprobs_21(demo):
    with pytest.raises(openai.BadRequestError) as e:
        demo.client.chat.completions.create(model=demo.name, messages=PARIS, logprobs=True, top_logprobs=21)
    assert e.value.body["param"] == "top_logprobs" and "0..20" in e.value.body["message"]


def bits(entries) -> list:
    return [(e.token, e.logprob.hex(), [(t, lp.hex()) for t, lp in e.top]) for e in entries]


def generated_logprobs(config: EngineConfig, prompt, n: int, spec: bool = False) -> list:
    with open_engine(config) as engine:
        steps = generate_ids(engine, prompt, engine.new_state(), Sampler(SamplingParams(temperature=0.8, seed=3)),
                             speculation=speculation("ngram", 4) if spec else None)
        out = [token_logprobs(logits, token, top=20) for (token, logits), _ in zip(steps, range(n))]
        steps.close()
        return bits(out)


def test_the_same_bits_at_two_budgets_on_two_backends_and_speculating(reference, tmp_path):
    _, tokenizer = reference
    trunk = tmp_path / "trunk"
    pack_trunk(DEMO_MODEL, trunk)
    prompt = render_chat([{"role": "user", "content": "one two one two one two"}], tokenizer, "instruct")
    want = generated_logprobs(EngineConfig(DEMO_MODEL), prompt, 12)
    assert generated_logprobs(EngineConfig(DEMO_MODEL, kernels="scalar", trunk=trunk, pin_layers=1, ring=2,
                                           cache_gb=0.0), prompt, 12) == want
    assert generated_logprobs(EngineConfig(DEMO_MODEL, speculate=4), prompt, 12, spec=True) == want


@pytest.mark.parametrize("scored_bytes", [64 << 20, 3 * 4 * 768])  # chunks of prefill_chunk 5, or of 3 rows
def test_a_scored_prompt_in_a_batch_is_engine_logits(reference, monkeypatch, scored_bytes):
    from k3core.generation import batch as batch_module

    monkeypatch.setattr(batch_module, "SCORED_LOGITS_BYTES", scored_bytes)
    engine, tokenizer = reference
    prompt = tokenizer.encode("The capital of France is Paris. The capital of Italy is")
    with open_engine(EngineConfig(DEMO_MODEL, sequences=2, prefill_chunk=5)) as batched:
        rows = []
        batch = BatchGenerator(batched)
        batch.add(tokenizer.encode("What is 2+3?"), batched.new_state())
        handle = batch.add(prompt, batched.new_state(), prompt_rows=rows.append)
        first = next(e for _ in range(20) for e in batch.step() if e.handle == handle)
    assert max(len(r) for r in rows) == min(5, scored_bytes // (4 * 768))
    got = np.concatenate(rows)
    assert got.view(np.uint32).tobytes() == engine.logits(prompt).view(np.uint32).tobytes()
    assert first.logits.view(np.uint32).tobytes() == got[-1].view(np.uint32).tobytes()


def test_servers_at_two_budgets_and_backends_give_the_same_bits(demo, tmp_path):
    trunk = tmp_path / "trunk"
    pack_trunk(DEMO_MODEL, trunk)
    other = Live(DEMO_MODEL, kernels="scalar", trunk=trunk, pin_layers=1, ring=2, cache_gb=0.0, speculate=4)
    other.worker.speculation = lambda: speculation("ngram", 4)
    try:
        def ask(live):
            r = live.client.chat.completions.create(model=live.name, messages=PARIS, temperature=0.7, seed=5,
                                                    logprobs=True, top_logprobs=20)
            return [(e.token, e.logprob.hex(), [(t.token, t.logprob.hex()) for t in e.top_logprobs])
                    for e in r.choices[0].logprobs.content]
        assert ask(other) == ask(demo)
    finally:
        other.close()
