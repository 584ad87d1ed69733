"""Structured output (k3core/generation/structured.py): a reply held to a JSON schema by a mask on the logits.

On the trained demo model and a random `small` model, the reply to each of k3core.testing.schemas' 22 schemas
parses and validates with `jsonschema` (a validator k3 did not write), greedy and sampled, in instruct and
thinking mode and as raw text. The ids are the same with drafts (adaptive, always wrong, always right), on every
kernel backend, at two memory budgets and in a batch of 4. A schema the library cannot enforce is refused by
name; a reply cut off by max_tokens says so.
"""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

from k3core import (BatchGenerator, Conversation, EngineConfig, Sampler, SamplingParams, Session, Speculation,
                    chat_grammar, load_tokenizer, open_engine)
from k3core.generation.generate import AUTO_K
from k3core.generation.structured import MAX_SCHEMA_BYTES, Grammar, SchemaError, reply_grammar, schema_text
from k3core.errors import UsageError
from k3core.io.pack import pack
from k3core import _native
from k3core.plugins.drafts import NgramDraft
from k3core.testing.schemas import SCHEMAS

from ..conftest import DEMO_MODEL
from .test_speculation import Listed

BY_NAME = {name: schema for name, _, schema in SCHEMAS}
SOME = ["enum_in_object", "array_of_objects", "string_pattern", "one_of_tagged", "ref_defs", "tuple", "nullable",
        "tool_arguments"]
SEEDED = dict(temperature=1.0, top_p=0.95, seed=5)


@pytest.fixture(scope="module", params=["demo", "small"])
def model(request, model_factory):
    return DEMO_MODEL if request.param == "demo" else model_factory("small")


@pytest.fixture(scope="module")
def engine(model):
    with open_engine(EngineConfig(model, speculate=AUTO_K, sequences=4)) as e:
        yield e


def ask(tokenizer, name: str, mode: str = "instruct") -> tuple[list[int], set[int], str]:
    """(prompt ids, stop ids, channel) of a one-question chat asking for schema `name`'s JSON."""
    conv = Conversation(tokenizer, mode)
    conv.add_user(f"Reply with JSON: {name.replace('_', ' ')}.")
    return conv.prompt(), conv.stop_ids, "think" if mode == "thinking" else "response"


def reply(engine, tokenizer, name: str, mode: str = "instruct", speculation=None, **params):
    """(ids, text by channel, stop reason) of a constrained chat reply to schema `name`."""
    prompt, stops, channel = ask(tokenizer, name, mode)
    params = SamplingParams(**{"max_tokens": 400, "json_schema": BY_NAME[name], **params})
    texts, done = {}, None
    for event in Session(engine, tokenizer).generate(prompt, params, stop_ids=stops, channel=channel,
                                                     speculation=speculation):
        if event.kind == "text":
            texts[event.channel] = texts.get(event.channel, "") + event.text
        else:
            done = event
    return done.ids, texts, done.reason


def valid(text: str, name: str) -> None:
    jsonschema.validate(json.loads(text), BY_NAME[name], format_checker=jsonschema.FormatChecker())


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_every_reply_parses_and_validates(engine, model, sampled):
    tokenizer = load_tokenizer(model)
    for name, _, _ in SCHEMAS:
        ids, texts, reason = reply(engine, tokenizer, name, **(SEEDED if sampled else {}))
        assert reason == "stop id" and ids[-1] == tokenizer.id_of("<|end_of_msg|>"), (name, reason)
        assert set(texts) == {"response"}, name
        valid(texts["response"], name)


def test_a_thinking_reply_thinks_freely_then_answers_in_json():
    """On the demo model, which closes its thinking (a random model's free thinking may run to max_tokens)."""
    tokenizer = load_tokenizer(DEMO_MODEL)
    with open_engine(EngineConfig(DEMO_MODEL)) as engine:
        for name in SOME[:3]:
            ids, texts, reason = reply(engine, tokenizer, name, mode="thinking")
            assert reason == "stop id" and texts["think"], name
            valid(texts["response"], name)


def test_raw_text_ends_with_eos_after_the_json(engine, model):
    tokenizer = load_tokenizer(model)
    session = Session(engine, tokenizer)
    params = SamplingParams(max_tokens=400, json_schema=BY_NAME["tool_arguments"])
    events = list(session.generate(tokenizer.encode("The weather call:"), params))
    assert events[-1].reason == "stop id" and events[-1].ids[-1] == tokenizer.id_of("[EOS]")
    valid("".join(e.text for e in events if e.kind == "text"), "tool_arguments")


def test_a_reply_cut_off_by_max_tokens_says_so_and_is_not_json(engine, model):
    tokenizer = load_tokenizer(model)
    ids, texts, reason = reply(engine, tokenizer, "array_of_objects", max_tokens=6)
    assert reason == "max tokens" and len(ids) == 6
    with pytest.raises(json.JSONDecodeError):
        json.loads(texts["response"])


@pytest.mark.parametrize("params", [{}, SEEDED], ids=["greedy", "sampled"])
def test_drafts_change_passes_never_ids(engine, model, params):
    """Drafts are verified under the mask: adaptive lookup, always right (the serial ids), always wrong (id 0,
    which the grammar never allows); the ids forced by the grammar are drafted whatever the source says."""
    tokenizer = load_tokenizer(model)
    for name in SOME:
        serial, _, _ = reply(engine, tokenizer, name, **params)
        for draft in (NgramDraft(None), Listed(serial), Listed([0] * len(serial))):
            spec = Speculation(draft, k=AUTO_K, adaptive=draft.name == "ngram")
            assert reply(engine, tokenizer, name, speculation=spec, **params)[0] == serial, (name, draft.name)


def test_forced_ids_are_drafted_so_a_json_reply_takes_fewer_passes(engine, model):
    tokenizer = load_tokenizer(model)
    prompt, stops, channel = ask(tokenizer, "array_of_objects")
    params = SamplingParams(max_tokens=400, json_schema=BY_NAME["array_of_objects"])
    runs = {}
    for label, spec in (("serial", None), ("never right", Speculation(Listed([]), k=AUTO_K))):
        done = list(Session(engine, tokenizer).generate(prompt, params, stop_ids=stops, channel=channel,
                                                        speculation=spec))[-1]
        runs[label] = done.ids, done.stats["decode_passes"]
    assert runs["never right"][0] == runs["serial"][0]
    assert runs["never right"][1] < runs["serial"][1]  # `{"people": [{"name": "` and the closing markup are forced


def test_a_batch_of_four_gives_each_reply_its_serial_ids(engine, model):
    tokenizer = load_tokenizer(model)
    names = SOME[:4]
    serial = {name: reply(engine, tokenizer, name, **SEEDED)[0] for name in names}
    batch, handles, got = BatchGenerator(engine), {}, {name: [] for name in names}
    for name in names:
        prompt, _, channel = ask(tokenizer, name)
        grammar = Grammar(tokenizer, reply_grammar(schema_text(BY_NAME[name]), channel))
        handles[batch.add(prompt, engine.new_state(), Sampler(SamplingParams(**SEEDED), grammar.constraint()),
                          Speculation(NgramDraft(None), k=AUTO_K, adaptive=True))] = name
    eom = tokenizer.id_of("<|end_of_msg|>")
    while batch.sequences:
        emitted = batch.step()
        for handle in dict.fromkeys(e.handle for e in emitted):
            for used, e in enumerate((x for x in emitted if x.handle == handle), start=1):
                got[handles[handle]].append(e.token)
                if e.token == eom:
                    batch.remove(handle, used)
                    break
    assert got == serial


def backend_and_budget_runs(trunk):
    yield "resident, 2 GB cache", dict()
    for backend in _native.available_backends():
        yield f"kernels {backend}", dict(kernels=backend)
    yield "streamed: 1 pinned layer, ring 2, cache floor", dict(trunk=trunk, pin_layers=1, ring=2, cache_gb=0.0)


def test_the_same_ids_on_every_backend_and_at_two_budgets(model, tmp_path):
    tokenizer = load_tokenizer(model)
    trunk = tmp_path / "trunk"
    pack(model, trunk, progress=None)
    runs = {}
    for label, fields in backend_and_budget_runs(trunk):
        with open_engine(EngineConfig(model, **fields)) as engine:
            runs[label] = [reply(engine, tokenizer, name, **SEEDED)[0] for name in SOME[:4]]
    first = next(iter(runs.values()))
    assert all(r == first for r in runs.values()), [label for label, r in runs.items() if r != first]


# ---- refusals ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("schema, problem", [
    ([1, 2], "must be a JSON object"),
    ("{not json", "not JSON"),
    ({"description": "x" * MAX_SCHEMA_BYTES}, f"over {MAX_SCHEMA_BYTES} bytes"),
    ({"v": float("nan")}, "not JSON-serialisable"),
])
def test_a_schema_that_is_not_a_json_object_within_the_limit_is_refused(schema, problem):
    with pytest.raises(SchemaError, match=problem) as e:
        schema_text(schema, "response_format.json_schema.schema")
    assert e.value.param == "response_format.json_schema.schema"
    with pytest.raises(UsageError, match=problem):
        SamplingParams(json_schema=schema)


def test_a_schema_the_library_cannot_enforce_is_refused_naming_the_keyword():
    tokenizer = load_tokenizer(DEMO_MODEL)
    with pytest.raises(SchemaError, match=r'cannot be enforced: .*Unimplemented keys: \["uniqueItems"\]') as e:
        chat_grammar(tokenizer, "response", schema=schema_text({"type": "array", "uniqueItems": True}),
                     schema_param="text.format.schema")
    assert e.value.param == "text.format.schema"
    with pytest.raises(SchemaError, match="Invalid type") as e:
        chat_grammar(tokenizer, "response", schema=schema_text({"type": "strin"}))
    tools = [{"name": "ok", "parameters": BY_NAME["tool_arguments"]},
             {"name": "bad", "parameters": {"type": "object", "properties": {"x": {"$ref": "#/nope"}}}}]
    for choice in ("required", "auto"):
        with pytest.raises(SchemaError, match="does not exist") as e:
            chat_grammar(tokenizer, "response", schema=schema_text({"type": "object"}), tools=tools, tool_choice=choice)
        assert e.value.param == "tools[1].parameters", choice


def test_no_grammar_when_nothing_is_asked_and_a_named_tool_must_be_declared():
    tokenizer = load_tokenizer(DEMO_MODEL)
    assert chat_grammar(tokenizer, "response", tools=[{"name": "f"}], tool_choice="auto") is None
    with pytest.raises(SchemaError, match="no declared tool is named 'g'"):
        chat_grammar(tokenizer, "response", tools=[{"name": "f"}], tool_choice="g")


def test_a_schema_needs_the_tokenizer():
    with open_engine(EngineConfig(DEMO_MODEL)) as engine:
        with pytest.raises(UsageError, match="needs the model's tokenizer"):
            list(Session(engine).generate([1, 2], SamplingParams(json_schema={"type": "object"})))


# ---- k3 run --json-schema ----------------------------------------------------------------------------------

def test_k3_run_json_schema_prints_a_valid_reply(tmp_path, capsys):
    from k3core.cli.main import main

    schema = tmp_path / "args.schema.json"
    schema.write_text(json.dumps(BY_NAME["tool_arguments"]))
    assert main(["run", str(DEMO_MODEL), "Weather in Paris?", "--chat", "--json-schema", str(schema), "--gen", "200",
                 "--quiet"]) == 0
    valid(capsys.readouterr().out, "tool_arguments")
    report = tmp_path / "run.json"
    assert main(["run", str(DEMO_MODEL), "Weather in Paris?", "--chat", "--json-schema", str(schema), "--gen", "5",
                 "--quiet", "--json", str(report)]) == 0
    assert json.loads(report.read_text())["stop_reason"] == "max tokens"


@pytest.mark.parametrize("content, args, problem", [
    ('{"type": "array", "uniqueItems": true}', ["--chat"], r"cannot be enforced: .*uniqueItems"),
    ("[1]", ["--chat"], "a JSON schema must be a JSON object"),
    (None, ["--chat"], "No such file or directory"),
    ('{"type": "object"}', ["--ids", "1,2"], "--json-schema needs a text prompt"),
])
def test_k3_run_refuses_a_bad_schema_file_by_name_with_exit_2(tmp_path, capsys, content, args, problem):
    from k3core.cli.main import main

    schema = tmp_path / "s.json"
    if content is not None:
        schema.write_text(content)
    prompt = [] if "--ids" in args else ["Hi"]
    assert main(["run", str(DEMO_MODEL), *prompt, *args, "--json-schema", str(schema), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert re.search(problem, err), err
    assert "--json-schema" in err
