"""The curl lines of docs/SERVER.md (and a few more of the same shape) against a live `k3 serve` of the demo model,
run by the curl binary as a user runs them. curl is a system tool, not a Python dependency: without it these
skip."""
from __future__ import annotations

import json
import shutil
import subprocess

import jsonschema
import pytest

CURL = shutil.which("curl")
pytestmark = pytest.mark.skipif(CURL is None, reason="curl is not installed")
PARIS = [{"role": "user", "content": "What is the capital of France?"}]


def curl(url: str, body: dict, *headers: str, stream: bool = False) -> str:
    cmd = [CURL, "-sS", "--fail-with-body", *(["-N"] if stream else []), url, "-H", "Content-Type: application/json"]
    for h in headers:
        cmd += ["-H", h]
    done = subprocess.run(cmd + ["-d", json.dumps(body)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_chat_whole_and_streamed(demo):
    r = json.loads(curl(demo.url + "/v1/chat/completions", {"model": demo.name, "messages": PARIS, "temperature": 0}))
    assert r["choices"][0]["message"]["content"] == "The capital of France is Paris."
    lines = [line for line in curl(demo.url + "/v1/chat/completions", {
        "model": demo.name, "stream": True, "stream_options": {"include_usage": True}, "messages": PARIS,
        "temperature": 0}, stream=True).splitlines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == \
        "The capital of France is Paris."
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


def test_structured_output_and_echoed_logprobs(demo):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
              "additionalProperties": False}
    r = json.loads(curl(demo.url + "/v1/chat/completions", {
        "model": demo.name, "messages": PARIS, "temperature": 0, "max_tokens": 100,
        "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}}}))
    assert r["choices"][0]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), schema)
    r = json.loads(curl(demo.url + "/v1/completions", {"model": demo.name, "prompt": "The capital of France is",
                                                        "max_tokens": 1, "echo": True, "logprobs": 1,
                                                        "temperature": 0}))
    lp = r["choices"][0]["logprobs"]
    assert lp["token_logprobs"][0] is None and all(x <= 0 for x in lp["token_logprobs"][1:])
    text = r["choices"][0]["text"]  # the prompt echoed, then one generated id (" Par")
    assert "".join(lp["tokens"]) == text and text.startswith("The capital of France is P")
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) > 2


def test_messages_count_tokens_and_responses(demo):
    version = "anthropic-version: 2023-06-01"
    ask = {"model": demo.name, "max_tokens": 64, "messages": PARIS, "temperature": 0}
    r = json.loads(curl(demo.url + "/v1/messages", ask, version))
    assert r["content"] == [{"type": "text", "text": "The capital of France is Paris."}]
    counted = json.loads(curl(demo.url + "/v1/messages/count_tokens", {"model": demo.name, "messages": PARIS},
                              version))
    u = r["usage"]
    assert counted == {"input_tokens": u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]}
    r = json.loads(curl(demo.url + "/v1/responses", {"model": demo.name, "input": "What is the capital of France?",
                                                     "temperature": 0}))
    assert r["status"] == "completed" and r["output"][0]["content"][0]["text"] == "The capital of France is Paris."
