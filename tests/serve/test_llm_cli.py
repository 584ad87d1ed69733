"""Simon Willison's `llm` CLI (PyPI `llm`, in the test extra) against a live `k3 serve`, as a user sets it up: an
OpenAI-compatible model in `extra-openai-models.yaml` under a temporary LLM_USER_PATH, once through chat completions
and once through the Responses API (`responses: true`), each run as a subprocess. Plain prompts (streamed and not),
and `--schema` in both its forms: the concise 'name str, age int' and a JSON schema file. Every body llm sends is
recorded on the server's side, so a reply is validated (jsonschema) against the schema llm actually sent.

The demo model never closes an unbounded JSON string (it never saw JSON: under the mask it writes its answers'
words to max_tokens), so the concise form, whose strings have no maxLength, runs on a random `small` model, greedy
(its argmax closes the string after "Hello" within ~130 ids; llm cannot send a seed on the Responses route: its
`-o seed` goes to the openai SDK's `responses.create()`, which has no such argument); the file form bounds its
strings and runs on the demo model."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import yaml
import llm  # noqa: F401  (the test extra installs it: an ImportError here is a broken install, not a skip)
import pytest

from . import conftest
from .conftest import Live
from ..conftest import DEMO_MODEL

PERSON_FILE = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                                "age": {"type": "integer", "minimum": 0, "maximum": 120}},
               "required": ["name", "age"], "additionalProperties": False}
ROUTES = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}


class Recorder:
    """ASGI middleware: the JSON body of every POST, as (path, body), in order."""

    def __init__(self, app):
        self.app, self.bodies = app, []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        chunks = []

        async def tap():
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    self.bodies.append((scope["path"], json.loads(b"".join(chunks))))
            return message

        return await self.app(scope, tap, send)


def recorded_live(model) -> tuple[Live, Recorder]:
    recorders = []
    real = conftest.build_app

    def build(*args, **kwargs):
        recorders.append(Recorder(real(*args, **kwargs)))
        return recorders[0]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conftest, "build_app", build)
        live = Live(model)
    return live, recorders[0]


@pytest.fixture(scope="module")
def servers(model_factory):
    demo, demo_bodies = recorded_live(DEMO_MODEL)
    small, small_bodies = recorded_live(model_factory("small"))
    yield {"demo": (demo, demo_bodies), "small": (small, small_bodies)}
    demo.close()
    small.close()


@pytest.fixture(scope="module")
def llm_home(servers, tmp_path_factory):
    """LLM_USER_PATH with one llm model per (server, API): k3-demo, k3-demo-responses, k3-small, k3-small-responses."""
    home = tmp_path_factory.mktemp("llm-home")
    models = []
    for key, (live, _) in servers.items():
        for api in ROUTES:
            entry = {"model_id": f"k3-{key}" + ("-responses" if api == "responses" else ""), "model_name": live.name,
                     "api_base": live.url + "/v1", "supports_schema": True}
            if api == "responses":
                entry["responses"] = True
            models.append(entry)
            if key == "demo":  # `reasoning: true` gives the model llm's reasoning options
                models.append({**entry, "model_id": entry["model_id"] + "-reasoning", "reasoning": True})
    (home / "extra-openai-models.yaml").write_text(yaml.safe_dump(models, sort_keys=False))
    return home


def llm_cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("llm")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "llm"]
    env = {**os.environ, "LLM_USER_PATH": str(home)}
    env.pop("OPENAI_API_KEY", None)
    return subprocess.run(cmd + list(args), env=env, capture_output=True, text=True, timeout=300)


def run_llm(home: Path, *args: str) -> str:
    done = llm_cli(home, *args)
    assert done.returncode == 0, f"llm {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def last_logged(home: Path) -> dict:
    return json.loads(run_llm(home, "logs", "-n", "1", "--json"))[0]


def sent(bodies, api: str) -> dict:
    """The body of the last request llm sent, checked to have gone to `api`'s route."""
    path, body = bodies.bodies[-1]
    assert path == ROUTES[api]
    return body


def sent_schema(body: dict, api: str) -> dict:
    if api == "chat":
        fmt = body["response_format"]
        assert fmt["type"] == "json_schema"
        return fmt["json_schema"]["schema"]
    fmt = body["text"]["format"]
    assert fmt["type"] == "json_schema"
    return fmt["schema"]


@pytest.mark.parametrize("api", list(ROUTES))
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_a_plain_prompt(servers, llm_home, api, stream):
    model = "k3-demo" + ("-responses" if api == "responses" else "")
    out = run_llm(llm_home, "-m", model, "-o", "temperature", "0", *([] if stream else ["--no-stream"]),
                  "What is the capital of France?")
    assert out == "The capital of France is Paris.\n"
    body = sent(servers["demo"][1], api)
    assert body["stream"] is stream and body["model"] == "demo-model"
    logged = last_logged(llm_home)  # llm read the usage: streamed chat asks for it with stream_options
    assert logged["response"] == "The capital of France is Paris." and logged["input_tokens"] > 0
    assert logged["output_tokens"] > 0


@pytest.mark.parametrize("api", list(ROUTES))
def test_schema_dsl(servers, llm_home, api):
    _, bodies = servers["small"]
    model = "k3-small" + ("-responses" if api == "responses" else "")
    out = run_llm(llm_home, "-m", model, "--schema", "name str, age int", "-o", "temperature", "0",
                  "-o", "max_tokens", "2000", "Hello")
    schema = sent_schema(sent(bodies, api), api)
    assert schema == {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                      "required": ["name", "age"]}
    jsonschema.validate(json.loads(out), schema)


@pytest.mark.parametrize("api", list(ROUTES))
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_schema_file(servers, llm_home, api, stream, tmp_path):
    path = tmp_path / "person.json"
    path.write_text(json.dumps(PERSON_FILE))
    model = "k3-demo" + ("-responses" if api == "responses" else "")
    out = run_llm(llm_home, "-m", model, "--schema", str(path), "-o", "temperature", "0",
                  *([] if stream else ["--no-stream"]), "Invent a person")
    schema = sent_schema(sent(servers["demo"][1], api), api)
    assert schema == PERSON_FILE
    person = json.loads(out)
    jsonschema.validate(person, schema)
    assert last_logged(llm_home)["schema_json"] == PERSON_FILE


def test_thinking_through_chat_completions(servers, llm_home):
    """`-o reasoning_effort` reaches k3 as chat's reasoning_effort: the model thinks (llm keeps the thinking in its
    log, not on stdout) and answers."""
    out = run_llm(llm_home, "-m", "k3-demo-reasoning", "-o", "reasoning_effort", "medium", "-o", "temperature", "0",
                  "--no-stream", "What is the capital of France?")
    assert out == "The capital of France is Paris.\n"
    assert sent(servers["demo"][1], "chat")["reasoning_effort"] == "medium"
    message = last_logged(llm_home)["response_json"]["choices"][0]["message"]
    assert message["reasoning_content"]  # the thinking, as k3 sent it


def test_a_reasoning_model_on_the_responses_route_thinks_and_answers(servers, llm_home):
    """A Responses-routed model with `reasoning: true`: llm always sends `include: ["reasoning.encrypted_content"]`
    (and `reasoning.summary: "auto"`); k3 accepts it — its reasoning is plain text in the reasoning item already,
    nothing to add — and the model thinks and answers."""
    out = run_llm(llm_home, "-m", "k3-demo-responses-reasoning", "-o", "temperature", "0", "--no-stream",
                  "What is the capital of France?")
    body = sent(servers["demo"][1], "responses")
    assert body["include"] == ["reasoning.encrypted_content"] and body["reasoning"] == {"summary": "auto"}
    assert out == "The capital of France is Paris.\n"
