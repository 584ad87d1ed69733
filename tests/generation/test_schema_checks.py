"""What a schema must pass before its grammar is compiled (k3core/generation/schema_checks.py, structured.py's
`check_schema` and `Grammar._probe`), and what happens when a grammar still fails mid-reply: GrammarError for that
reply alone, never the stop id its mask falls back to, and a batch that drops that sequence while the others keep
the ids they get alone (SequenceFailed). The HTTP side is tests/faults/test_requests.py."""
from __future__ import annotations

import json

import numpy as np
import pytest

from k3core import BatchGenerator, EngineConfig, Sampler, SamplingParams, load_tokenizer, open_engine
from k3core.generation.batch import SequenceFailed
from k3core.generation.schema_checks import no_finite_instance, pattern_problem, patterns
from k3core.generation.structured import Grammar, GrammarError, SchemaError, reply_grammar, schema_text

from ..conftest import DEMO_MODEL


def defs(schema: dict, **named) -> dict:
    return {"$defs": named, **schema}


def obj(**required) -> dict:
    return {"type": "object", "properties": required, "required": list(required)}


N = {"$ref": "#/$defs/n"}
# (schema, has a finite instance) -- the answers are known by hand
FINITE_CASES = [
    ({"$ref": "#"}, False),
    (defs({"$ref": "#/$defs/a"}, a={"$ref": "#/$defs/b"}, b={"$ref": "#/$defs/a"}), False),
    (defs(N, n=obj(c=N)), False),
    (defs(N, n={"type": "array", "items": N, "minItems": 1}), False),
    (defs(N, n={"type": "array", "prefixItems": [{"type": "integer"}, N], "minItems": 2}), False),
    (defs(N, n={"type": "array", "items": [{"type": "integer"}, N], "minItems": 2}), False),  # draft-07 tuple
    (defs(N, n={"anyOf": [obj(c=N), {"$ref": "#/$defs/n/anyOf/0"}]}), False),
    (defs(N, n={"allOf": [{"type": "object"}, obj(c=N)]}), False),
    (defs(N, n=obj(a={"type": "integer"}, c=N)), False),  # a reply would nest without end, never close
    (defs(N, n={"type": "object", "properties": {"c": N}}), True),  # c is optional
    (defs(N, n={"type": "array", "items": N}), True),  # [] ends it
    (defs(N, n={"type": "array", "items": N, "minItems": 1, "prefixItems": [{"type": "integer"}]}), True),
    (defs(N, n={"properties": {"c": N}, "required": ["c"]}), True),  # no type: any non-object is an instance
    (defs(N, n={"type": ["object", "null"], "properties": {"c": N}, "required": ["c"]}), True),
    (defs(N, n=obj(c={"anyOf": [{"type": "null"}, N]})), True),
    (defs(N, n=obj(c={"oneOf": [N, {"type": "string"}]})), True),
    ({"$ref": "other.json#/x"}, True),  # another document: not modelled, never refused here
    (defs(N, n={"$id": "https://example.com/n", "$ref": "#"}), True),  # another resource: not modelled
    ({"type": "object", "properties": {"c": False}, "required": ["c"]}, True),  # no recursion: llguidance's to refuse
]


@pytest.mark.parametrize("schema, finite", FINITE_CASES, ids=[json.dumps(c[0])[:60] for c in FINITE_CASES])
def test_no_finite_instance_refuses_only_what_has_none(schema, finite):
    problem = no_finite_instance(schema)
    assert (problem is None) == finite, problem
    if not finite:
        assert problem.startswith("no finite JSON value satisfies it: the $ref ")


def test_a_long_ref_chain_is_walked_without_recursion():
    chain = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(5000)}
    assert no_finite_instance(defs({"$ref": "#/$defs/d0"}, **chain, d5000={"type": "integer"})) is None
    assert "'#/$defs/d0' at #/$defs/d5000" in no_finite_instance(defs({"$ref": "#/$defs/d0"}, **chain,
                                                                        d5000={"$ref": "#/$defs/d0"}))


def test_patterns_are_found_where_subschemas_are_and_checked_alone():
    schema = {"properties": {"a/b": {"pattern": "x"}, "pattern": {"type": "string"}},
              "items": [{"anyOf": [{"pattern": "y"}]}], "$defs": {"z": {"pattern": "z"}}}
    assert patterns(schema) == [("#/$defs/z/pattern", "z"), ("#/items/0/anyOf/0/pattern", "y"),
                                ("#/properties/a~1b/pattern", "x")]
    assert pattern_problem("^[A-Z]{3}-[0-9]{4}$") is None and pattern_problem("^a{100000}$") is None
    assert pattern_problem("^a{1000000}$") == "lexer error: too many expressions constructed"
    assert pattern_problem("(") == "regex parse error: unclosed group"


@pytest.mark.parametrize("schema, needle", [
    ({"$ref": "#"}, "no finite JSON value satisfies it"),
    ({"type": "object", "properties": {"s": {"type": "string", "pattern": "^a{1000000}$"}}},
     "the pattern at #/properties/s/pattern is too large to enforce: llguidance's lexer gives up building it "
     "(lexer error: too many expressions constructed; its limit, initial_lexer_fuel, is 1,000,000)"),
])
def test_schema_text_refuses_naming_the_field(schema, needle):
    with pytest.raises(SchemaError, match=None) as e:
        schema_text(schema, "text.format.schema")
    assert e.value.param == "text.format.schema" and needle in str(e.value)


def test_a_grammar_that_fails_at_its_first_ids_is_refused():
    """Two patterns that each build alone and not together, both required: the forced `{"x": "` reaches them."""
    both = {"type": "object", "required": ["x", "y"], "properties": {
        "x": {"type": "string", "pattern": "^a{100000}$"}, "y": {"type": "string", "pattern": "^b{100000}$"}}}
    with pytest.raises(SchemaError, match="its patterns are too large together") as e:
        Grammar(load_tokenizer(DEMO_MODEL), reply_grammar(schema_text(both), "response"), "response_format")
    assert e.value.param == "response_format"


def test_a_constraint_in_error_raises_and_never_allows_the_stop_id_alone(monkeypatch):
    """llguidance's mask in its error state allows the stop id alone: taken, a reply would stop "complete"."""
    tokenizer = load_tokenizer(DEMO_MODEL)
    monkeypatch.setattr(Grammar, "_probe", lambda self, param: None)  # as if the checks had missed it
    constraint = Grammar(tokenizer, reply_grammar('{"$ref": "#"}', "response")).constraint()
    with pytest.raises(GrammarError) as e:
        constraint.apply(np.zeros(tokenizer.vocab_size, np.float32))
    assert e.value.ids == 0 and "<state>" not in e.value.reason and "<state>" in e.value.detail


# two patterns each buildable alone: a grammar every check passes that fails a few ids into the string
MID_REPLY = {"anyOf": [{"type": "string", "pattern": "^a{100000}$"}, {"type": "string", "pattern": "^b{100000}$"}]}


def test_a_batch_drops_the_sequence_whose_grammar_fails_and_the_others_keep_their_ids():
    tokenizer = load_tokenizer(DEMO_MODEL)
    with open_engine(EngineConfig(DEMO_MODEL, sequences=2)) as engine:
        prompt = tokenizer.encode("Once upon a time")
        alone, batch = [], BatchGenerator(engine)
        batch.add(prompt, engine.new_state(), Sampler(SamplingParams(temperature=1.0, seed=7)))
        while len(alone) < 40:
            alone += [e.token for e in batch.step()]

        batch = BatchGenerator(engine)
        other = batch.add(prompt, engine.new_state(), Sampler(SamplingParams(temperature=1.0, seed=7)))
        grammar = Grammar(tokenizer, reply_grammar(schema_text(MID_REPLY), None), chat=False)
        failing = batch.add(tokenizer.encode("A string:"), engine.new_state(),
                            Sampler(SamplingParams(), grammar.constraint()))
        got, failures = [], {}
        while len(got) < 40:
            try:
                emitted = batch.step()
            except SequenceFailed as exc:
                emitted, failures = exc.emitted, {**failures, **exc.failed}
            got += [e.token for e in emitted if e.handle == other]
        assert list(failures) == [failing] and isinstance(failures[failing], GrammarError)
        assert 0 < failures[failing].ids < 8 and failing not in batch.sequences
        assert got == alone


# ---- soundness against an independent validator ------------------------------------------------------------
REFS = ["#", "#/$defs/a", "#/$defs/b", "#/properties/p", "#/anyOf/0", "#/$defs/a/items"]


def random_schema(rng, depth: int):
    """Objects, arrays, anyOf/oneOf/allOf and $refs among a few places, most of them recursive."""
    if depth <= 0 or rng.random() < 0.15:
        return rng.choice([True, {}, {"type": "integer"}, {"$ref": rng.choice(REFS)}])
    out = {}
    for _ in range(rng.randrange(1, 4)):
        key = rng.choice(["$ref", "type", "properties", "required", "items", "prefixItems", "minItems", "anyOf",
                          "oneOf", "allOf"])
        out[key] = {"$ref": lambda: rng.choice(REFS),
                    "type": lambda: rng.choice(["object", "array", ["object", "null"], "integer"]),
                    "required": lambda: rng.choice([["p"], ["c"], ["c", "p"]]),
                    "minItems": lambda: rng.choice([0, 1, 2]),
                    "properties": lambda: {rng.choice("pc"): random_schema(rng, depth - 1)
                                           for _ in range(rng.randrange(1, 3))},
                    "items": lambda: random_schema(rng, depth - 1),
                    }.get(key, lambda: [random_schema(rng, depth - 1) for _ in range(rng.randrange(1, 3))])()
    return out


def small_values(depth: int) -> list:
    """Every JSON value up to `depth` levels over a few atoms and the keys p and c (256 at depth 2)."""
    atoms = [None, 0, "s", True]
    if depth == 0:
        return atoms
    inner = small_values(depth - 1)
    return (atoms + [[], {}] + [[x] for x in inner] + [[x, y] for x in inner[:6] for y in inner[:6]]
            + [{"p": x} for x in inner] + [{"c": x} for x in inner]
            + [{"c": x, "p": y} for x in inner[:8] for y in inner[:8]])


def test_what_no_finite_instance_refuses_no_small_value_satisfies():
    """The `jsonschema` library (Draft 2020-12, written by others) finds no value up to two levels deep that
    satisfies any of 40 random recursive schemas no_finite_instance refuses (~2 s; 1,700 were checked once)."""
    import random

    import jsonschema

    rng, values, refused = random.Random(3), small_values(2), 0
    while refused < 40:
        schema = random_schema(rng, 3)
        if not isinstance(schema, dict):
            continue
        schema["$defs"] = {"a": random_schema(rng, 2), "b": random_schema(rng, 2)}
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
            validator = jsonschema.Draft202012Validator(schema)
        except jsonschema.SchemaError:
            continue
        if no_finite_instance(schema) is None:
            continue
        refused += 1
        for value in values:
            try:
                valid = validator.is_valid(value)
            except BaseException as exc:  # a pointer to nowhere; validating a recursion without end recurses
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                break
            assert not valid, (json.dumps(schema), json.dumps(value))
