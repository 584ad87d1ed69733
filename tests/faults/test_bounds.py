"""Every count bounded before it allocates: config.json's counts against the tensors present, layer lists that
partition the layers, files read whole with a byte limit that holds for devices and pipes, and JSON nesting
bounded in every parser (docs/LIMITS.md). Each row asserts the exit code (or HTTP status) and that the message
names the field, file or body; every `k3` runs in a subprocess with a timeout, so no row can hang the suite."""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest


TIMEOUT = 30                      # seconds; a refusal takes well under one
DEEP = 200_000                    # far past MAX_JSON_DEPTH (128) and past where json.loads recursed out
RUN = ["--ids", "1", "--gen", "1", "--quiet"]


def row(case, *values, full=False):
    return pytest.param(*values, id=case, marks=[pytest.mark.faults_full] if full else [])


def k3(*argv, env=None, stdin=subprocess.DEVNULL):
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "k3core", *map(str, argv)], capture_output=True, text=True,
                              timeout=TIMEOUT, stdin=stdin, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        pytest.fail(f"k3 {' '.join(map(str, argv))[:200]} ran past {TIMEOUT} s")
    return done, time.monotonic() - start


@pytest.fixture
def model(tiny_model, tmp_path):
    """The tiny model's files as symlinks (a row replaces the ones it breaks), config.json a copy."""
    out = tmp_path / "model"
    shutil.copytree(tiny_model, out, copy_function=os.symlink)
    put(out / "config.json", (tiny_model / "config.json").read_bytes())
    return out


def put(path, data):
    path.unlink(missing_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def point(path, target):
    path.unlink(missing_ok=True)
    os.symlink(target, path)
    return path


def edit(model, change):
    """config.json with `change(text_config)` applied."""
    raw = json.loads((model / "config.json").read_text())
    change(raw["text_config"])
    put(model / "config.json", json.dumps(raw))


def setting(**fields):
    return lambda text: text.update(fields)


def without_kda_list(**fields):
    return lambda text: (text["linear_attn_config"].pop("kda_layers"), text.update(fields))


def kda_list(change):
    return lambda text: text["linear_attn_config"].update(kda_layers=change(text["linear_attn_config"]["kda_layers"]))


# ---- 1. counts in config.json against the tensors the checkpoint holds ---------------------------------------
# (command, change to text_config, needle) -- the tiny model has layers 0..12 and experts 0..7
COUNT_CASES = [
    row("layers-1e9-run", "run", without_kda_list(num_hidden_layers=10**9),
        "num_hidden_layers 1000000000: the checkpoint has tensors for layers 0..12 and none for layer 13"),
    row("experts-1e9-run", "run", setting(num_experts=10**9),
        "num_experts 1000000000: layer 1 has tensors for experts 0..7 and none for expert 8"),
    row("layers-1e9-verify", "verify", without_kda_list(num_hidden_layers=10**9),
        "num_hidden_layers 1000000000: the checkpoint has tensors for layers 0..12"),
    row("layers-1e9-beside-a-kda-list-run", "run", setting(num_hidden_layers=10**9),
        "num_hidden_layers is 1000000000, but layers 14, 15, 16, 17, … (999,999,987 in all) are in neither "
        "text_config.linear_attn_config.kda_layers nor full_attn_layers"),
    row("layers-1e7-run", "run", without_kda_list(num_hidden_layers=10**7), "num_hidden_layers 10000000", full=True),
    row("layers-1e5-run", "run", without_kda_list(num_hidden_layers=10**5), "num_hidden_layers 100000", full=True),
    row("layers-one-past-run", "run", without_kda_list(num_hidden_layers=14),
        "num_hidden_layers 14: the checkpoint has tensors for layers 0..12 and none for layer 13", full=True),
    row("experts-1e9-verify", "verify", setting(num_experts=10**9), "num_experts 1000000000: layer 1", full=True),
    row("experts-one-past-run", "run", setting(num_experts=9),
        "num_experts 9: layer 1 has tensors for experts 0..7 and none for expert 8", full=True),
]


@pytest.mark.parametrize("command, change, needle", COUNT_CASES)
def test_config_counts(model, command, change, needle):
    edit(model, change)
    done, _ = k3(command, model, *(RUN if command == "run" else []))
    assert done.returncode == 2, done.stderr[-2000:]
    assert needle in done.stderr + done.stdout and f"{model}/config.json" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


# ---- 2. the layer lists partition the layers ----------------------------------------------------------------
LIST = "text_config.linear_attn_config.kda_layers"
LIST_CASES = [
    row("kda-layer-99", kda_list(lambda kda: kda + [99]), f"{LIST} entries 99 are outside 1..13 (the list is ONE-based)"),
    row("kda-and-mla", kda_list(lambda kda: kda + [4]), f"layers 4 are in both {LIST} and full_attn_layers"),
    row("kda-leaves-a-layer-out", kda_list(lambda kda: [x for x in kda if x != 2]),
        f"num_hidden_layers is 13, but layers 2 are in neither {LIST} nor full_attn_layers", full=True),
    row("kda-duplicate", kda_list(lambda kda: kda + [1]), f"{LIST} has duplicates: 1", full=True),
    row("kda-not-a-list", kda_list(lambda kda: "1-13"), f"field {LIST} must be a list of integers", full=True),
]


@pytest.mark.parametrize("change, needle", LIST_CASES)
def test_layer_lists(model, change, needle):
    edit(model, change)
    done, _ = k3("run", model, *RUN)
    assert done.returncode == 2 and needle in done.stderr and f"{model}/config.json" in done.stderr, done.stderr


@pytest.mark.faults_full
def test_a_flat_config_names_its_own_kda_list(model_factory, tmp_path):
    flat = tmp_path / "flat"
    shutil.copytree(model_factory("tiny", layout="flat"), flat, copy_function=os.symlink)
    raw = json.loads((flat / "config.json").read_text())
    put(flat / "config.json", json.dumps({**raw, "kda_layers": [1, 2, 3]}))
    done, _ = k3("run", flat, *RUN)
    assert done.returncode == 2 and "layers 5, 6, 7, 9, … (6 in all) are in neither kda_layers nor full_attn_layers" \
        in done.stderr, done.stderr


# ---- 3. files read whole, with a byte limit that holds for devices and pipes --------------------------------
def profile_dir(t, target):
    point(t / "profile.json", target)
    return {"K3_CONFIG_DIR": str(t)}


# (argv from (model, tmp_path), setup(model, tmp_path) -> extra environment, needle ({model}, {t} filled in))
BYTE_CASES = [
    row("prompt-file-/dev/zero", lambda m, t: ["run", m, "--prompt-file", "/dev/zero"], None,
        "/dev/zero: more than 4 MiB, the limit of a prompt (--prompt-file)"),
    row("ids-file-/dev/zero", lambda m, t: ["run", m, "--ids-file", "/dev/zero"], None,
        "/dev/zero: more than 4 MiB, the limit of a prompt (--ids-file)"),
    row("config.json-/dev/zero", lambda m, t: ["run", m, *RUN], lambda m, t: point(m / "config.json", "/dev/zero"),
        "{model}/config.json: more than 16 MiB, the limit of a model config"),
    row("tokenizer_config.json-/dev/zero", lambda m, t: ["run", m, "--prompt", "hi", "--gen", "1"],
        lambda m, t: point(m / "tokenizer_config.json", "/dev/zero"),
        "{model}/tokenizer_config.json: more than 16 MiB, the limit of a tokenizer config", full=True),
    row("tiktoken.model-/dev/zero", lambda m, t: ["run", m, "--prompt", "hi", "--gen", "1"],
        lambda m, t: point(m / "tiktoken.model", "/dev/zero"),
        "{model}/tiktoken.model: more than 16 MiB, the limit of a BPE ranks file", full=True),
    row("profile-/dev/zero", lambda m, t: ["run", "--prompt", "hi"], lambda m, t: profile_dir(t, "/dev/zero"),
        "{t}/profile.json: more than 16 MiB, the limit of a k3 profile", full=True),
    row("json-schema-/dev/zero", lambda m, t: ["run", m, "--prompt", "hi", "--json-schema", "/dev/zero"], None,
        "/dev/zero: more than 65,536 bytes, the limit of a JSON schema (--json-schema)"),
    row("index-json-past-256-MiB", lambda m, t: ["run", m, *RUN],
        lambda m, t: os.truncate(put(m / "model.safetensors.index.json", b"{}"), (256 << 20) + 1),
        "{model}/model.safetensors.index.json: more than 256 MiB, the limit of a shard index", full=True),
]


@pytest.mark.parametrize("argv, setup, needle", BYTE_CASES)
def test_files_read_whole(model, tmp_path, argv, setup, needle):
    env = setup(model, tmp_path) if setup else None
    done, seconds = k3(*argv(model, tmp_path), env=env if isinstance(env, dict) else None)
    assert done.returncode == 2, done.stderr[-2000:]
    assert needle.format(model=model, t=tmp_path) in done.stderr and "Traceback" not in done.stderr
    assert seconds < 10  # a refusal reads limit + 1 bytes, never the device's endless stream


@pytest.mark.faults_full
def test_a_prompt_file_that_is_an_endless_pipe(model):
    yes = subprocess.Popen(["yes"], stdout=subprocess.PIPE)
    try:
        done, _ = k3("run", model, "--prompt-file", "/dev/stdin", stdin=yes.stdout)
    finally:
        yes.kill()
        yes.wait()
        yes.stdout.close()
    assert done.returncode == 2 and "/dev/stdin: more than 4 MiB, the limit of a prompt (--prompt-file)" in done.stderr


# ---- 4. JSON nesting, in every parser ------------------------------------------------------------------------
NESTED = "[" * DEEP + "]" * DEEP


def says_too_deep(where, text) -> bool:
    """`text` refuses `where` for its nesting (at least DEEP levels), naming the limit."""
    return re.search(re.escape(f"{where}: JSON nested ") + r"2000\d\d levels deep, past the limit of 128", text) \
        is not None


def shard_with_metadata(model, first: bool):
    """Shard 1 with a deeply nested __metadata__ entry: first (the numpy path's check of the header's head) or
    last (the json.loads path)."""
    path = model / "model-00001-of-000015.safetensors"
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    entries = json.loads(data[8:8 + n])
    entries.pop("__metadata__", None)
    body = json.dumps(entries, separators=(",", ":"))[1:-1]
    meta = f'"__metadata__":{{"x":{NESTED}}}'
    header = ("{" + meta + "," + body + "}" if first else "{" + body + "," + meta + "}").encode()
    put(path, len(header).to_bytes(8, "little") + header + data[8 + n:])
    return path


def index_with_metadata(model):
    path = model / "model.safetensors.index.json"
    text = path.read_text()
    put(path, text.replace('"metadata": {', f'"metadata": {{"x": {NESTED}, ', 1))
    return path


def trunk_manifest(model, t):
    (t / "trunk").mkdir()
    return put(t / "trunk" / "manifest.json", NESTED)


# (argv from (model, tmp_path), setup(model, tmp_path) -> the file at fault, or an environment with its dir)
DEPTH_CASES = [
    row("config.json", lambda m, t: ["run", m, *RUN], lambda m, t: put(m / "config.json", NESTED)),
    row("safetensors-header-metadata-first", lambda m, t: ["run", m, *RUN], lambda m, t: shard_with_metadata(m, True)),
    row("index-json-metadata", lambda m, t: ["run", m, *RUN], lambda m, t: index_with_metadata(m)),
    row("tokenizer_config.json", lambda m, t: ["run", m, "--prompt", "hi", "--gen", "1"],
        lambda m, t: put(m / "tokenizer_config.json", NESTED)),
    row("safetensors-header-metadata-last", lambda m, t: ["run", m, *RUN], lambda m, t: shard_with_metadata(m, False),
        full=True),
    row("index-json-whole", lambda m, t: ["run", m, *RUN],
        lambda m, t: put(m / "model.safetensors.index.json", NESTED), full=True),
    row("verify-header", lambda m, t: ["verify", m], lambda m, t: shard_with_metadata(m, True), full=True),
    row("trunk-manifest.json", lambda m, t: ["run", m, "--trunk", t / "trunk", *RUN], trunk_manifest, full=True),
    row("profile", lambda m, t: ["run", "--prompt", "hi"], lambda m, t: put(t / "profile.json", NESTED), full=True),
]


@pytest.mark.parametrize("argv, setup", DEPTH_CASES)
def test_json_depth_in_files(model, tmp_path, argv, setup):
    path = setup(model, tmp_path)
    done, _ = k3(*argv(model, tmp_path), env={"K3_CONFIG_DIR": str(tmp_path)})
    assert done.returncode == 2, done.stderr[-2000:]
    assert says_too_deep(path, done.stderr + done.stdout) and "Traceback" not in done.stderr, done.stderr[-2000:]


@pytest.mark.faults_full
def test_json_depth_in_an_engine_option(model):
    done, _ = k3("run", model, *RUN, "--store-option", "direct_io=" + "[" * 100_000)
    assert done.returncode == 2 and "--store-option direct_io: JSON nested 100000 levels deep" in done.stderr, \
        done.stderr[-2000:]


@pytest.fixture(scope="module")
def engine(tiny_model):
    from k3core import EngineConfig, open_engine

    with open_engine(EngineConfig(tiny_model)) as e:
        yield e


def state_with_meta(engine, tmp_path, meta: bytes):
    from k3core import save_state

    path = tmp_path / "s.npz"
    save_state(path, engine, engine.new_state())
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["meta"] = np.frombuffer(meta, np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


@pytest.mark.parametrize("meta, said", [
    row("nested", NESTED.encode(), lambda path, text: says_too_deep(f"{path}: its 'meta' member", text), full=True),
    row("past-16-MiB", b" " * ((16 << 20) + 1), lambda path, text: f"{path}: its 'meta' member: more than 16 MiB, "
        "the limit of a state file's metadata" in text, full=True),
])
def test_state_file_metadata(engine, tmp_path, meta, said):
    from k3core import load_state
    from k3core.files.limits import LimitError

    path = state_with_meta(engine, tmp_path, meta)
    with pytest.raises(LimitError) as refused:
        load_state(path, engine)
    assert refused.value.exit_code == 2 and said(path, str(refused.value))


@pytest.mark.faults_full
def test_setup_state_file(tmp_path):
    from k3core.files.limits import LimitError
    from wizard.state import STATE, read_state

    put(tmp_path / STATE, NESTED)
    with pytest.raises(LimitError) as refused:
        read_state(tmp_path)
    assert refused.value.exit_code == 2 and says_too_deep(tmp_path / STATE, str(refused.value))


# ---- request bodies: `k3 serve` and `k3 ui`'s /v1 -------------------------------------------------------------
@pytest.fixture(scope="module")
def serve_client(engine, tiny_model):
    from fastapi.testclient import TestClient

    from k3core import load_tokenizer
    from serve.api import ApiOptions
    from serve.app import build_app
    from serve.worker import EngineSlot, Worker

    worker = Worker(EngineSlot(engine, load_tokenizer(tiny_model)), queue_size=4)
    try:
        yield TestClient(build_app(worker, ApiOptions()), raise_server_exceptions=False)
    finally:
        worker.close()


@pytest.fixture(scope="module")
def ui_client(tiny_model):
    import fastapi
    from fastapi.testclient import TestClient

    from k3core import EngineConfig
    from ui.host import EngineHost
    from ui.server import ServerOptions, openai_routes

    host = EngineHost(EngineConfig(tiny_model))
    worker, router = openai_routes(host, ServerOptions(queue_size=4), None)
    app = fastapi.FastAPI()
    app.include_router(router)
    try:
        yield TestClient(app, raise_server_exceptions=False)
    finally:
        worker.close()
        host.close()


def tool_call_arguments(arguments: str) -> bytes:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return json.dumps({"model": "k3", "messages": [{"role": "user", "content": "hi"},
                                                   {"role": "assistant", "content": "", "tool_calls": [call]}]}).encode()


BODY, ARGUMENTS = "the request body", "messages[1].tool_calls[0].function.arguments"
BODY_CASES = [
    row("serve-chat", "serve_client", "/v1/chat/completions", NESTED.encode(), BODY),
    row("ui-chat", "ui_client", "/v1/chat/completions", NESTED.encode(), BODY),
    row("serve-completions", "serve_client", "/v1/completions", NESTED.encode(), BODY, full=True),
    row("ui-messages", "ui_client", "/v1/messages", NESTED.encode(), BODY),  # Anthropic-shaped: error.message too
    row("ui-responses", "ui_client", "/v1/responses", NESTED.encode(), BODY),
    row("serve-function-call-arguments", "serve_client", "/v1/responses", json.dumps({"model": "k3", "input": [
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": NESTED}]}).encode(), "input[0].arguments"),
    row("serve-nested-in-an-object", "serve_client", "/v1/chat/completions",
        ('{"model": "k3", "messages": ' + NESTED + "}").encode(), BODY, full=True),
    row("serve-tool-call-arguments", "serve_client", "/v1/chat/completions", tool_call_arguments(NESTED), ARGUMENTS,
        full=True),
]


SCHEMA_PAST_THE_LIMIT = {"type": "object", "description": "x" * (64 << 10)}
SCHEMA_CASES = [
    row("serve-response-format", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA_PAST_THE_LIMIT}}},
        "response_format.json_schema.schema"),
    row("serve-text-format", "/v1/responses", {"input": "hi", "text": {"format": {
        "type": "json_schema", "name": "s", "schema": SCHEMA_PAST_THE_LIMIT}}}, "text.format.schema"),
    row("serve-tool-parameters", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
        "tool_choice": "required", "tools": [{"type": "function", "function": {
            "name": "f", "parameters": SCHEMA_PAST_THE_LIMIT}}]}, "tools[0].function.parameters"),
]


@pytest.mark.parametrize("route, body, where", SCHEMA_CASES)
def test_a_schema_past_its_limit(serve_client, route, body, where):
    r = serve_client.post(route, json={"model": "k3", **body})
    assert r.status_code == 400, r.text[:2000]
    assert r.json()["error"]["param"] == where and "over 65536 bytes (MAX_SCHEMA_BYTES)" in r.json()["error"]["message"]


def test_a_chat_on_a_model_without_chat_markup_is_a_400_naming_it(serve_client):
    """The tiny test model's tokenizer has no XTML markers: a chat is refused, not a 500."""
    for route, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                        ("/v1/responses", {"input": "hi", "text": {"format": {"type": "json_object"}}})):
        r = serve_client.post(route, json={"model": "k3", **body})
        assert r.status_code == 400 and "this model cannot chat" in r.json()["error"]["message"], r.text[:2000]


@pytest.mark.parametrize("client, route, body, where", BODY_CASES)
def test_request_bodies(request, client, route, body, where):
    r = request.getfixturevalue(client).post(route, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text[:2000]
    assert says_too_deep(where, r.json()["error"]["message"])


# ---- the depth measure itself: json.loads's own nesting, strings and escapes skipped -------------------------
def depth_of(value) -> int:
    inner = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
    return 0 if inner is None else 1 + max(map(depth_of, inner), default=0)


def random_text(rng) -> str:
    return "".join(rng.choice('[]{}"\\ a\u00e9\u4e2d\n') for _ in range(rng.randrange(6)))


def random_document(rng, levels: int):
    """Lists, objects and strings full of brackets, quotes and backslashes."""
    if levels == 0 or rng.random() < 0.3:
        return random_text(rng) if rng.random() < 0.7 else rng.choice([1, 2.5, None, True])
    items = [random_document(rng, levels - 1) for _ in range(rng.randrange(4))]
    return items if rng.random() < 0.5 else {random_text(rng): item for item in items}


def test_nesting_depth_is_the_depth_json_loads_builds():
    from k3core.files.limits import nesting_depth

    rng = random.Random(0)
    for _ in range(500):
        document = random_document(rng, 8)
        text = json.dumps(document, ensure_ascii=rng.random() < 0.5)
        assert nesting_depth(text) == depth_of(document) == nesting_depth(text.encode()), text


@pytest.mark.parametrize("text, depth", [('"[[[["', 0), ('"abc' + "[" * 300, 0), ("[" * 300, 300)])
def test_nesting_depth_of_a_text_json_loads_refuses(text, depth):
    from k3core.files.limits import nesting_depth

    assert nesting_depth(text) == depth
