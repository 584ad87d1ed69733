"""What lm-evaluation-harness's `local-completions` model asks of `k3 serve`, over real HTTP on the demo model:
the tokenizer routes as vLLM serves them (lm-eval's `tokenizer_backend=remote`: GET /tokenizer_info, POST
/tokenize {prompt, add_special_tokens}, POST /detokenize {tokens}) and llama.cpp's shapes of them; several prompts
in one /v1/completions request (lm-eval's batch_size > 1), each choice the bytes the prompt gets alone; and
`max_tokens: 0` with echo and logprobs, the prompt scored and nothing generated. `make eval-check` runs lm-eval
itself against a live server."""
from __future__ import annotations

import json

import httpx
import pytest

from k3core.text.chat import render as render_chat
from serve.schema import MAX_PROMPTS_PER_REQUEST

from .conftest import KEY

PROMPTS = ["The capital of France is", "The capital of Japan is", "2 + 2 ="]
TEXTS = ["The capital of France is", "naïve café 北京 👋🏽 <|open|>response<|sep|>", " \n\t 12345 [EOS]"]
LOGLIKELIHOOD = {"temperature": 0, "logprobs": 1, "echo": True, "seed": 1234}  # lm-eval's scoring request


def post(live, path: str, body, status: int = 200) -> dict:
    r = httpx.post(live.url + path, json=body, timeout=60)
    assert r.status_code == status, r.text
    return r.json()


def refused(live, path: str, body, param: str, status: int = 400) -> str:
    """The error message of a refusal naming `param`."""
    error = post(live, path, body, status)["error"]
    assert error["param"] == param, error
    return error["message"]


def test_tokenize_and_detokenize_give_k3s_ids_in_vllm_and_llama_cpp_shapes(demo):
    tokenizer = demo.slot.tokenizer
    for text in TEXTS:
        ids = tokenizer.encode(text)  # special-token text stays text, as /v1/completions encodes it
        vllm = post(demo, "/tokenize", {"prompt": text, "add_special_tokens": False})  # lm-eval's exact body
        assert vllm == {"count": len(ids), "max_model_len": demo.engine.max_context, "tokens": ids,
                        "token_strs": None}
        assert post(demo, "/tokenize", {"model": demo.name, "prompt": text, "add_special_tokens": True}) == vllm
        assert post(demo, "/tokenize", {"content": text}) == {"tokens": ids}
        assert post(demo, "/detokenize", {"tokens": ids}) == {"prompt": text, "content": text}
    ids = tokenizer.encode("café")
    strs = post(demo, "/tokenize", {"prompt": "café", "return_token_strs": True})["token_strs"]
    pieces = post(demo, "/tokenize", {"content": "café", "with_pieces": True})["tokens"]
    assert "".join(strs) == "café" and [p["id"] for p in pieces] == ids
    assert all(p["piece"] == tokenizer.token_bytes(p["id"]).decode() if isinstance(p["piece"], str)
               else bytes(p["piece"]) == tokenizer.token_bytes(p["id"]) for p in pieces)


def test_tokenize_a_chat_gives_the_prompt_chat_completions_forwards(demo):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
    got = post(demo, "/tokenize", {"messages": messages})
    assert got["tokens"] == render_chat(messages, demo.slot.tokenizer, "instruct")
    chat = post(demo, "/v1/chat/completions", {"model": demo.name, "messages": messages, "max_tokens": 1})
    assert got["count"] == chat["usage"]["prompt_tokens"]
    assert refused(demo, "/tokenize", {"messages": messages, "add_generation_prompt": False},
                   "add_generation_prompt").startswith("add_generation_prompt: not served")


def test_tokenizer_info_is_the_checkpoints_tokenizer_config(demo):
    info = httpx.get(demo.url + "/tokenizer_info").json()
    config = demo.slot.tokenizer.config
    assert info == config and info["eos_token"] == "[EOS]" and info["tokenizer_class"] == "TikTokenTokenizer"


def test_the_tokenizer_routes_refuse_by_name(demo):
    over = "x " * demo.engine.max_context  # more ids than the context holds
    for field in ("prompt", "content"):
        message = refused(demo, "/tokenize", {field: over}, field)
        assert message.startswith(f"{field}: encodes to ") and "context limit of 4096 (--max-context)" in message
    message = refused(demo, "/detokenize", {"tokens": [0] * (demo.engine.max_context + 1)}, "tokens")
    assert message == "tokens: holds 4097 ids, over the context limit of 4096 (--max-context)"
    for body, param in (({}, "prompt"), ({"prompt": "a", "content": "b"}, "prompt"), ({"prompt": ["a"]}, "prompt"),
                        ({"content": 5}, "content"), ({"messages": "hi"}, "messages"),
                        ({"prompt": "a", "model": 3}, "model"),
                        ({"prompt": "a", "add_special_tokens": "no"}, "add_special_tokens")):
        refused(demo, "/tokenize", body, param)
    for tokens in (None, "1 2", [1, True], [1, 10 ** 6]):
        refused(demo, "/detokenize", {"tokens": tokens}, "tokens")
    refused(demo, "/tokenize", {"prompt": "a", "model": "gpt-9"}, "model", 404)
    assert post(demo, "/tokenize", [1], 400)["error"]["code"] == "invalid_json"


def test_with_an_api_key_the_tokenizer_routes_ask_for_it():
    from fastapi.testclient import TestClient

    from serve.api import ApiOptions
    from serve.app import build_app

    client = TestClient(build_app(None, ApiOptions(api_key=KEY)))  # the key is checked before any engine work
    for method, path in (("GET", "/tokenizer_info"), ("POST", "/tokenize"), ("POST", "/detokenize")):
        r = client.request(method, path, json={"prompt": "a"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, r.text)


def choices_alone(live, prompts, **ask) -> list[str]:
    """Each prompt's choice sent in a request of its own, as JSON text (a float's digits are its bits)."""
    return [json.dumps({**post(live, "/v1/completions", {"model": live.name, "prompt": p, **ask})["choices"][0]})
            for p in prompts]


@pytest.mark.parametrize("ask", [{"max_tokens": 6, "temperature": 0, "logprobs": 2},
                                 {**LOGLIKELIHOOD, "max_tokens": 1},  # lm-eval 0.4.13's loglikelihood
                                 {**LOGLIKELIHOOD, "max_tokens": 0}])
def test_several_prompts_are_each_the_bytes_they_get_alone(demo, ask):
    ids = [demo.slot.tokenizer.encode(p) for p in PROMPTS]
    for prompts in (PROMPTS, ids):  # texts (tokenized_requests=False), lists of ids (lm-eval's default)
        many = post(demo, "/v1/completions", {"model": demo.name, "prompt": prompts, **ask})
        alone = choices_alone(demo, prompts, **ask)
        assert [c["index"] for c in many["choices"]] == [0, 1, 2]
        assert [json.dumps({**c, "index": 0}) for c in many["choices"]] == alone
        assert many["usage"]["prompt_tokens"] == sum(map(len, ids))
        assert many["usage"]["completion_tokens"] == sum(len(c["logprobs"]["tokens"]) for c in many["choices"]) \
            - (sum(map(len, ids)) if ask.get("echo") else 0)


def test_max_tokens_0_with_echo_scores_the_prompt_and_generates_nothing(demo):
    prompt, ids = PROMPTS[0], demo.slot.tokenizer.encode(PROMPTS[0])
    scored = post(demo, "/v1/completions", {"model": demo.name, "prompt": prompt, **LOGLIKELIHOOD, "max_tokens": 0})
    choice, usage = scored["choices"][0], scored["usage"]
    assert choice["text"] == prompt and choice["finish_reason"] == "length"
    assert usage["completion_tokens"] == 0 and usage["prompt_tokens"] == len(ids)
    one = post(demo, "/v1/completions", {"model": demo.name, "prompt": prompt, **LOGLIKELIHOOD, "max_tokens": 1})
    assert {k: v[:len(ids)] for k, v in one["choices"][0]["logprobs"].items()} == choice["logprobs"]  # the same bits
    plain = post(demo, "/v1/completions", {"model": demo.name, "prompt": prompt, "echo": True, "max_tokens": 0})
    assert plain["choices"][0]["text"] == prompt and plain["choices"][0]["logprobs"] is None
    body = {"model": demo.name, "prompt": prompt, **LOGLIKELIHOOD, "max_tokens": 0, "stream": True}
    with httpx.stream("POST", demo.url + "/v1/completions", json=body, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert "".join(e["choices"][0]["text"] for e in events) == prompt
    assert events[0]["choices"][0]["logprobs"] == choice["logprobs"] and events[-1]["choices"][0]["finish_reason"] \
        == "length"
    message = refused(demo, "/v1/completions", {"model": demo.name, "prompt": prompt, "max_tokens": 0}, "max_tokens")
    assert "only `echo: true` makes meaningful" in message


def test_several_prompts_are_bounded_and_each_is_checked(demo):
    def completions(prompt, **more):
        return {"model": demo.name, "prompt": prompt, "max_tokens": 1, **more}

    message = refused(demo, "/v1/completions", completions(["a"] * (MAX_PROMPTS_PER_REQUEST + 1)), "prompt")
    assert message == f"prompt: at most {MAX_PROMPTS_PER_REQUEST} prompts per request, got 65"
    assert len(post(demo, "/v1/completions", completions(["a"] * MAX_PROMPTS_PER_REQUEST))["choices"]) == 64
    refused(demo, "/v1/completions", completions(PROMPTS, stream=True), "stream")
    refused(demo, "/v1/completions", completions(["a", ""]), "prompt[1]")
    refused(demo, "/v1/completions", completions([[1, 2], [1, 10 ** 6]]), "prompt[1]")
    refused(demo, "/v1/completions", completions(["a", "x " * 5000]), "prompt[1]")  # past the context
