"""`k3 serve` driven by the official `openai` package (and raw HTTP where the client hides the wire), live on
127.0.0.1, on the trained demo model and on a generated one."""
from __future__ import annotations

import json
import subprocess
import threading
import time

import httpx
import jsonschema
import openai
import pytest

from k3core.cli.main import main

from ..conftest import DEMO_MODEL
from .conftest import CALLS, KEY, Live, burst, free_port, script_tool_calls

PARIS = [{"role": "user", "content": "What is the capital of France?"}]


def test_models_and_health(demo):
    assert [m.id for m in demo.client.models.list().data] == [demo.name]
    assert demo.client.models.retrieve(demo.name).id == demo.name
    health = httpx.get(demo.url + "/health").json()
    assert health["status"] == "ok" and health["model"] == demo.name


def test_chat_answers_and_reports_usage(demo):
    r = demo.client.chat.completions.create(model=demo.name, messages=PARIS, temperature=0)
    assert r.choices[0].message.content == "The capital of France is Paris."
    assert r.choices[0].finish_reason == "stop" and r.object == "chat.completion"
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streaming_gives_the_same_text_and_a_usage_chunk(demo):
    whole = demo.client.chat.completions.create(model=demo.name, messages=PARIS, temperature=0)
    chunks = list(demo.client.chat.completions.create(model=demo.name, messages=PARIS, temperature=0, stream=True,
                                                      stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_the_sse_wire_ends_with_done(demo):
    body = {"model": demo.name, "messages": PARIS, "stream": True, "temperature": 0}
    with httpx.stream("POST", demo.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    json.loads(lines[-2][6:])


def test_a_stop_string_cuts_the_reply(demo):
    r = demo.client.chat.completions.create(model=demo.name, messages=PARIS, temperature=0, stop=["Paris"])
    assert r.choices[0].message.content == "The capital of France is " and r.choices[0].finish_reason == "stop"


def test_max_tokens_ends_with_length(demo):
    r = demo.client.chat.completions.create(model=demo.name, messages=PARIS, temperature=0, max_completion_tokens=3)
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"


def test_a_follow_up_turn_forwards_only_its_new_tokens(demo):
    first = demo.client.chat.completions.create(model=demo.name, messages=PARIS, temperature=0)
    turn = PARIS + [{"role": "assistant", "content": first.choices[0].message.content},
                    {"role": "user", "content": "What is the capital of Italy?"}]
    before = demo.engine.tokens_forwarded
    second = demo.client.chat.completions.create(model=demo.name, messages=turn, temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens + first.usage.completion_tokens - 1
    # the engine forwarded the new prompt ids and the reply's (all but its last, which is never forwarded)
    assert demo.engine.tokens_forwarded - before == second.usage.prompt_tokens - cached + second.usage.completion_tokens - 1
    assert second.choices[0].message.content == "The capital of Italy is Rome."


def test_a_seeded_completion_is_the_text_k3_run_gives_with_that_seed(demo, capsys):
    r = demo.client.completions.create(model=demo.name, prompt="The capital of", max_tokens=8, temperature=0.9,
                                       seed=11)
    assert main(["run", str(DEMO_MODEL), "--prompt", "The capital of", "--max-tokens", "8", "--temperature", "0.9",
                 "--seed", "11", "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == r.choices[0].text.strip() and len(r.choices[0].text) > 8
    again = demo.client.completions.create(model=demo.name, prompt="The capital of", max_tokens=8, temperature=0.9,
                                           seed=11)
    assert again.choices[0].text == r.choices[0].text


def test_thinking_goes_to_reasoning_content(demo):
    r = demo.client.chat.completions.create(model=demo.name, messages=PARIS, reasoning_effort="high", temperature=0,
                                            max_tokens=24)
    message = r.choices[0].message
    thinking = getattr(message, "reasoning_content", None) or message.model_extra.get("reasoning_content")
    assert isinstance(thinking, str)
    chunks = list(demo.client.chat.completions.create(model=demo.name, messages=PARIS, reasoning_effort="high",
                                                      temperature=0, max_tokens=24, stream=True))
    streamed = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks if c.choices)
    assert streamed == thinking


def test_bad_requests_name_the_field(demo):
    with pytest.raises(openai.BadRequestError) as e:
        demo.client.chat.completions.create(model=demo.name, messages=PARIS, temperature=7)
    assert e.value.status_code == 400 and e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        demo.client.chat.completions.create(model=demo.name, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x"}}]}])
    assert e.value.body["param"] == "messages[0].content[0]"
    with pytest.raises(openai.BadRequestError) as e:
        demo.client.chat.completions.create(model=demo.name, messages=[{"role": "user", "content": "x " * 5000}])
    assert e.value.body["code"] == "context_length_exceeded" and "4096" in e.value.body["message"]
    with pytest.raises(openai.NotFoundError) as e:
        demo.client.chat.completions.create(model="gpt-9", messages=PARIS)
    assert e.value.body["code"] == "model_not_found"
    r = httpx.post(demo.url + "/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(demo.url + "/v1/chat/completions", json={"model": demo.name, "messages": PARIS, "n": 2,
                                                            "some_future_field": {"x": 1}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


def test_what_k3_does_not_do_is_refused_not_ignored(demo):
    for field, value in (("presence_penalty", 0.5), ("frequency_penalty", -1)):
        r = httpx.post(demo.url + "/v1/chat/completions", json={"model": demo.name, "messages": PARIS, field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (field, r.text)
    r = httpx.post(demo.url + "/v1/chat/completions", json={"model": demo.name, "messages": PARIS, "temperature": 0,
                                                            "presence_penalty": 0, "response_format": {"type": "text"},
                                                            "logprobs": False}, timeout=60)
    assert r.status_code == 200  # the values that ask for nothing different are fine


def test_k3_sampling_fields_reach_the_sampler(demo, capsys):
    body = {"model": demo.name, "prompt": "The capital of", "max_tokens": 8, "temperature": 0.9, "seed": 4,
            "top_k": 3, "min_p": 0.05, "repetition_penalty": 1.3}
    text = httpx.post(demo.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    assert main(["run", str(DEMO_MODEL), "--prompt", "The capital of", "--max-tokens", "8", "--temperature", "0.9",
                 "--seed", "4", "--top-k", "3", "--min-p", "0.05", "--repeat-penalty", "1.3", "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == text.strip()
    r = httpx.post(demo.url + "/v1/completions", json={**body, "top_k": -1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_k"


def test_unknown_fields_are_ignored(demo):
    r = httpx.post(demo.url + "/v1/chat/completions", json={"model": demo.name, "messages": PARIS, "temperature": 0,
                                                            "logit_bias": {}, "user": "u", "x_future": [1]}, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "The capital of France is Paris."


def test_four_concurrent_streams_are_each_what_the_request_gets_alone(generated):
    prompts = [[{"role": "user", "content": f"tell me about {w}"}] for w in ("cats", "the sea", "bread", "42")]

    def ask(messages):
        chunks = generated.client.chat.completions.create(model=generated.name, messages=messages, temperature=0.7,
                                                          seed=5, max_tokens=12, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    alone = [ask(m) for m in prompts]
    generated.worker.cache.clear()  # the concurrent runs start from fresh states too
    passes = generated.engine.forward_passes
    together: list = [None] * 4
    threads = [threading.Thread(target=lambda i=i: together.__setitem__(i, ask(prompts[i]))) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone
    assert generated.engine.forward_passes - passes < 4 * 12  # they shared passes


def test_a_client_that_disconnects_frees_its_place(generated):
    body = {"model": generated.name, "messages": [{"role": "user", "content": "go on"}], "stream": True,
            "max_tokens": 60}
    done_before, stored = generated.worker.completed, generated.cache.stats()["prompt_cache_stored_tokens"]
    with httpx.stream("POST", generated.url + "/v1/chat/completions", json=body, timeout=60) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i == 3:
                break
    deadline = time.time() + 30
    while generated.worker.stats()["active"] and time.time() < deadline:
        time.sleep(0.05)
    assert generated.worker.stats()["active"] == 0 and generated.worker.completed == done_before + 1
    kept = generated.cache.stats()["prompt_cache_stored_tokens"] - stored  # the cancelled turn's state, whole
    assert 0 < kept < 60 + 40


def test_a_full_queue_answers_429_with_retry_after(model_factory):
    live = Live(model_factory("small"), sequences=1, queue_size=1)
    try:
        body = {"model": live.name, "messages": [{"role": "user", "content": "long"}], "max_tokens": 64}
        results = burst(live, "/v1/chat/completions", body)
        codes = sorted(r.status_code for r in results)
        assert codes.count(200) >= 2 and 429 in codes, codes
        busy = next(r for r in results if r.status_code == 429)
        assert int(busy.headers["Retry-After"]) >= 1 and busy.json()["error"]["type"] == "rate_limit_error"
    finally:
        live.close()


def test_an_api_key_is_required_when_set_and_bodies_are_bounded(model_factory):
    live = Live(model_factory("small"), api_key=KEY, max_body_bytes=2000)
    try:
        assert [m.id for m in live.client.models.list().data] == [live.name]
        wrong = openai.OpenAI(base_url=live.url + "/v1", api_key="not-the-key", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as e:
            wrong.models.list()
        assert e.value.status_code == 401 and "KEY" in e.value.body["message"] and KEY not in e.value.body["message"]
        r = httpx.post(live.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                       json={"model": live.name, "messages": [{"role": "user", "content": "x" * 5000}]})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    finally:
        live.close()


def test_a_forced_tool_call_round_trip(generated):
    """On a random model: the mask holds the forced call to the tool's parameters (a bounded string, so it ends)."""
    parameters = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
                  "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "weather in a city",
                                                "parameters": parameters}}]
    ask = [{"role": "user", "content": "weather in Paris?"}]
    r = generated.client.chat.completions.create(model=generated.name, messages=ask, tools=tools, max_tokens=120,
                                                 tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), parameters)
    follow = ask + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    r2 = generated.client.chat.completions.create(model=generated.name, messages=follow, tools=tools, max_tokens=4)
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens


def test_loopback_only_by_default_and_no_open_host_without_a_key(demo, capsys, monkeypatch):
    port = demo.url.rsplit(":", 1)[1]
    listening = subprocess.run(["ss", "-ltn"], capture_output=True, text=True).stdout
    mine = [line.split()[3] for line in listening.splitlines()[1:] if line.split()[3].endswith(":" + port)]
    assert mine == [f"127.0.0.1:{port}"], listening
    monkeypatch.delenv("K3_API_KEY", raising=False)
    assert main(["serve", str(DEMO_MODEL), "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "refusing to listen on 0.0.0.0 without an API key" in err


def test_speculating_server_replies_as_the_serial_one(model_factory):
    """Two concurrent requests on a server that verifies drafts: one drafted by an oracle (the serial reply's
    ids), one by prompt lookup; both replies are the serial server's, in fewer passes than ids."""
    from k3core import SamplingParams, Speculation
    from k3core.text.chat import render as render_chat
    from k3core.plugin_api import DraftSource
    from k3core.plugins.drafts import NgramDraft
    from k3core.testing.engines import generation

    asks = [[{"role": "user", "content": "the the the the the"}], [{"role": "user", "content": "one two one two"}]]
    plain = Live(model_factory("small"), sequences=2)
    try:
        want = [plain.client.chat.completions.create(model=plain.name, messages=m, temperature=0,
                                                     max_tokens=40).choices[0].message.content for m in asks]
        serial_ids = generation(plain.engine, render_chat(asks[0], plain.slot.tokenizer), 40, SamplingParams())[0]
    finally:
        plain.close()

    class Oracle(DraftSource):
        name = "oracle"

        def propose(self, history, generated, k):
            return serial_ids[generated:generated + k] if tuple(history[-1:]) == (serial_ids[generated - 1],) else []

    live = Live(model_factory("small"), sequences=2, speculate=4)
    drafts = iter([Speculation(Oracle(None), 4), Speculation(Oracle(None), 4), Speculation(NgramDraft(None), 4)])
    live.worker.speculation = lambda: next(drafts)
    try:
        passes = live.engine.forward_passes
        alone = live.client.chat.completions.create(model=live.name, messages=asks[0], temperature=0, max_tokens=40)
        assert alone.choices[0].message.content == want[0]
        assert live.engine.forward_passes - passes <= 1 + 40 // 5 + 1  # 5 ids per verify pass: all drafts accepted
        got = [None, None]
        first = threading.Thread(target=lambda: got.__setitem__(0, live.client.chat.completions.create(
            model=live.name, messages=asks[0], temperature=0, max_tokens=40).choices[0].message.content))
        first.start()
        time.sleep(0.05)
        got[1] = live.client.chat.completions.create(model=live.name, messages=asks[1], temperature=0,
                                                     max_tokens=40).choices[0].message.content
        first.join()
        assert got == want
    finally:
        live.close()


def test_the_command_listens_on_loopback_only(tmp_path):
    import sys

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "k3core", "serve", str(DEMO_MODEL), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        listening = subprocess.run(["ss", "-ltn"], capture_output=True, text=True).stdout
        mine = [line.split()[3] for line in listening.splitlines()[1:] if line.split()[3].endswith(f":{port}")]
        assert mine == [f"127.0.0.1:{port}"], listening
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert f"at http://127.0.0.1:{port}/v1" in out


def test_a_failed_pass_ends_only_its_requests_and_bad_ones_never_reach_the_engine(model_factory):
    live = Live(model_factory("small"), sequences=2)
    try:
        real = live.engine.forward_batch
        calls = {"n": 0}

        def failing_once(*a, **kw):
            calls["n"] += 1
            if calls["n"] == 3:
                raise OSError("the disk went away")
            return real(*a, **kw)

        live.engine.forward_batch = failing_once
        with pytest.raises(openai.InternalServerError) as e:
            live.client.chat.completions.create(model=live.name, messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=10)
        assert "the disk went away" in e.value.body["message"] and e.value.body["code"] == "engine_error"
        with pytest.raises(openai.BadRequestError):  # refused before the engine: nothing else disturbed
            live.client.chat.completions.create(model=live.name, messages=[{"role": "user", "content": "x " * 9000}])
        r = live.client.chat.completions.create(model=live.name, messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=4, temperature=0)
        assert r.usage.completion_tokens == 4 and live.worker.stats()["failed"] == 1
    finally:
        del live.engine.forward_batch
        live.close()


def test_a_reply_that_calls_a_tool_becomes_tool_calls(generated, monkeypatch):
    """The engine runs as always, but every pick follows a script (the model's output forced to a complete
    XTML tool call): non-streaming and streaming both return it as `tool_calls`, finish_reason tool_calls."""
    calls_out, script = CALLS, script_tool_calls(monkeypatch, generated)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    ask = [{"role": "user", "content": "weather in Paris?"}]
    r = generated.client.chat.completions.create(model=generated.name, messages=ask, tools=tools, max_tokens=len(script))
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and message.content == "Checking."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == calls_out
    chunks = list(generated.client.chat.completions.create(model=generated.name, messages=ask, tools=tools,
                                                           max_tokens=len(script), stream=True))
    carrying = [ch.choices[0].delta.tool_calls for ch in chunks if ch.choices and ch.choices[0].delta.tool_calls]
    assert len(carrying) == 2  # each call went out as soon as its element closed, not both at the end
    calls = [c for part in carrying for c in part]
    assert [(c.index, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        (i, name, args) for i, (name, args) in enumerate(calls_out)]
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"
    # the result goes back as a tool message and the conversation goes on
    follow = ask + [message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "sunny, 21 C"}]
    monkeypatch.undo()  # the real sampler again
    again = generated.client.chat.completions.create(model=generated.name, messages=follow, tools=tools, max_tokens=3)
    assert again.usage.prompt_tokens > r.usage.prompt_tokens


@pytest.mark.parametrize("body, param", [
    ({"messages": PARIS}, "model"),
    ({"messages": PARIS, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"messages": PARIS, "stop": 3}, "stop"),
    ({"messages": PARIS, "max_tokens": 0}, "max_tokens"),
    ({"messages": PARIS, "max_completion_tokens": 10 ** 9}, "max_completion_tokens"),
    ({"messages": PARIS, "seed": -1}, "seed"),
    ({"messages": PARIS, "stream": "yes"}, "stream"),
    ({"messages": PARIS, "stream_options": []}, "stream_options"),
    ({"messages": PARIS, "reasoning_effort": "huge"}, "reasoning_effort"),
    ({"messages": PARIS, "thinking": {"type": "sometimes"}}, "thinking"),
    ({"messages": PARIS, "tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"messages": PARIS, "tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]},
     "tools[0].function.parameters"),
    ({"messages": PARIS, "tool_choice": {"type": "function", "function": {"name": "g"}},
      "tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice"),
    ({"messages": PARIS, "tool_choice": "required"}, "tool_choice"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "not json"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "assistant", "content": "x", "reasoning_content": 5}]}, "messages[0].reasoning_content"),
])
def test_each_bad_field_is_a_400_naming_it(demo, body, param):
    r = httpx.post(demo.url + "/v1/chat/completions", json={"model": demo.name, **body} if param != "model" else body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert r.json()["error"]["message"].startswith(param)


def test_completions_refuse_what_they_cannot_serve(demo):
    for body, param in (({"prompt": ""}, "prompt"), ({"prompt": ["a", 5]}, "prompt"),
                        ({"prompt": "x", "suffix": "y"}, "suffix")):
        r = httpx.post(demo.url + "/v1/completions", json={"model": demo.name, **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_an_api_key_must_be_long_and_a_bad_flag_is_named(capsys, monkeypatch):
    from k3core.errors import UsageError
    from serve.http import api_key

    monkeypatch.delenv("K3_API_KEY", raising=False)
    assert api_key(None) is None and api_key(KEY) == KEY
    for bad in ("short", "sixteen chars ok?"):
        with pytest.raises(UsageError, match="at least 16 characters without spaces"):
            api_key(bad)
    monkeypatch.setenv("K3_API_KEY", "short")
    with pytest.raises(UsageError):
        api_key(None)
    assert main(["serve", str(DEMO_MODEL), "--prompt-cache-gb", "2000"]) == 2  # -1: argparse's refusal (SystemExit)
    assert "--prompt-cache-gb must be a number of GB in 0..1024" in capsys.readouterr().err


def test_a_completion_prompt_may_be_token_ids(demo):
    """As OpenAI takes them (and lm-eval sends them): the ids of a text give that text's completion; echo gives the
    ids' text back; an id outside the vocabulary is a 400 naming `prompt` (several prompts:
    test_lm_eval_api.py)."""
    text = "The capital of France is"
    ids = demo.slot.tokenizer.encode(text)
    ask = dict(model=demo.name, max_tokens=6, temperature=0, echo=True, logprobs=1)
    by_text = demo.client.completions.create(prompt=text, **ask)
    for prompt in (ids, [ids]):
        by_ids = demo.client.completions.create(prompt=prompt, **ask)
        assert by_ids.choices[0].text == by_text.choices[0].text and by_ids.choices[0].text.startswith(text)
        assert by_ids.choices[0].logprobs.token_logprobs == by_text.choices[0].logprobs.token_logprobs
    for prompt in ([ids[0], 10 ** 6], [[ids[0], 10 ** 6]], [], [True]):
        with pytest.raises(openai.BadRequestError) as e:
            demo.client.completions.create(model=demo.name, prompt=prompt, max_tokens=2)
        assert e.value.body["param"] == "prompt", prompt
