"""Measures two constrained-decoding libraries for k3 (issue 25, item 3): llguidance and xgrammar, on a
tiktoken vocabulary built from files (no hub download): the demo model's, and a synthetic BPE-like one of
163,840 byte strings (K3's size). Per JSON schema: does it compile, does a valid instance pass the mask
token by token and an invalid one get blocked; compile time; mask and advance time per token; each mask
computed twice and compared by bytes. Not a test, and not part of k3: it runs in its own venv, e.g.

  python3 -m venv /tmp/cdvenv
  /tmp/cdvenv/bin/pip install llguidance tiktoken numpy jsonschema
  /tmp/cdvenv/bin/pip install --no-deps xgrammar apache-tvm-ffi pydantic pydantic-core annotated-types \\
      typing-inspection typing-extensions   # not its declared torch, transformers, triton: see below
  /tmp/cdvenv/bin/python benchmarks/constrained_bench.py --json /tmp/constrained.json        # ~3 min
  taskset -c 0 /tmp/cdvenv/bin/python benchmarks/constrained_bench.py --xgr-threads 8   # same mask digests?

xgrammar imports torch and transformers at import time, but its matcher only needs a DLPack array (numpy
is one): when torch cannot be imported, empty stand-in modules are put under those two names for the
import, and nothing of theirs is ever called. Results: docs/STRUCTURED-OUTPUT.md.
"""
import argparse
import base64
import collections
import hashlib
import json
import os
import re
import statistics
import sys
import sysconfig
import time
import types
from pathlib import Path

import jsonschema
import numpy as np

DEMO = Path(__file__).resolve().parent.parent / "wizard" / "data" / "demo-model"
K3_VOCAB = 163_840
STOPS = ("<|close|>", "[EOS]")  # the body of a k3 reply ends at <|close|> (k3core/text/chat.py)
JSON_OPTS_LLG = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}

# ---- the schemas: (name, schema, a valid instance, an invalid one) --------------------------------------
OBJ = {"type": "object"}
FREE_TEXT = ("Every token at 8 GB of RAM reads about 134.6 GB from disk: ~106 GB of trunk and ~26 GB of experts. "
             "At 3 GB/s that is 45 s per token, so the engine pins what it can and streams the rest; the answer "
             "never changes (\"byte-identical\"), only the time.\nCafé, naïve, 北京 — and a tab\there. " * 2)
SCHEMAS = [
    ("enum_top", {"enum": ["red", "green", "blue"]}, "green", "purple"),
    ("enum_in_object", {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
                        "required": ["colour"], "additionalProperties": False}, {"colour": "blue"}, {"colour": "pink"}),
    ("enum_unicode", {"type": "object", "properties": {"city": {"enum": ["北京", "東京", "naïve café", "Zürich"]}},
                      "required": ["city"]}, {"city": "東京"}, {"city": "Tokyo"}),
    ("enum_200", {"type": "object", "properties": {"w": {"enum": [f"word{i:03d}" for i in range(200)]}}, "required": ["w"]},
     {"w": "word137"}, {"w": "word200"}),
    ("nested_objects", {"type": "object", "required": ["name", "address"], "properties": {
        "name": {"type": "string"}, "address": {"type": "object", "required": ["city", "geo"], "properties": {
            "city": {"type": "string"}, "geo": {"type": "object", "required": ["lat", "lon"], "properties": {
                "lat": {"type": "number"}, "lon": {"type": "number"}}}}}}},
     {"name": "Ada", "address": {"city": "Paris", "geo": {"lat": 48.85, "lon": 2.35}}},
     {"name": "Ada", "address": {"city": "Paris", "geo": {"lat": "north"}}}),
    ("array_min_max", {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4}, [1, 2, 3], [1]),
    ("array_of_objects", {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["id", "ok"],
                          "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}}}},
     [{"id": 1, "ok": True}, {"id": 2, "ok": False}], [{"id": 1}]),
    ("optional_fields", {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"}}},
     {"name": "Ada", "email": "ada@example.org"}, {"age": 36}),
    ("string_pattern", {"type": "object", "required": ["code"], "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}}}, {"code": "ABC-1234"}, {"code": "abc-12"}),
    ("string_length", {"type": "object", "required": ["s"], "properties": {"s": {"type": "string", "minLength": 3,
                       "maxLength": 8}}}, {"s": "hello"}, {"s": "hi"}),
    ("string_format_date", {"type": "object", "required": ["day"], "properties": {"day": {"type": "string", "format": "date"}}},
     {"day": "2026-12-02"}, {"day": "yesterday"}),
    ("number_bounds", {"type": "object", "required": ["p"], "properties": {"p": {"type": "number", "minimum": 0, "maximum": 1}}},
     {"p": 0.25}, {"p": 1.5}),
    ("integer_bounds", {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer", "minimum": -5,
                        "maximum": 1000}}}, {"n": 999}, {"n": 1001}),
    ("exclusive_bounds", {"type": "object", "required": ["t"], "properties": {"t": {"type": "integer",
                          "exclusiveMinimum": 0, "exclusiveMaximum": 10}}}, {"t": 9}, {"t": 0}),
    ("any_of", {"type": "object", "required": ["v"], "properties": {"v": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}},
     {"v": 42}, {"v": True}),
    ("one_of_tagged", {"oneOf": [
        {"type": "object", "required": ["kind", "r"], "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
         "additionalProperties": False},
        {"type": "object", "required": ["kind", "w", "h"], "properties": {"kind": {"const": "rect"}, "w": {"type": "number"},
         "h": {"type": "number"}}, "additionalProperties": False}]},
     {"kind": "rect", "w": 2, "h": 3}, {"kind": "circle", "w": 2}),
    ("all_of", {"allOf": [{"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}}},
                          {"type": "object", "required": ["b"], "properties": {"b": {"type": "string"}}}]},
     {"a": 1, "b": "x"}, {"a": 1}),
    ("ref_defs", {"$defs": {"point": {"type": "object", "required": ["x", "y"], "properties": {
        "x": {"type": "integer"}, "y": {"type": "integer"}}, "additionalProperties": False}},
        "type": "object", "required": ["from", "to"], "properties": {"from": {"$ref": "#/$defs/point"},
                                                                  "to": {"$ref": "#/$defs/point"}}},
     {"from": {"x": 0, "y": 0}, "to": {"x": 3, "y": 4}}, {"from": {"x": 0}, "to": {"x": 3, "y": 4}}),
    ("ref_recursive", {"$defs": {"node": {"type": "object", "required": ["v"], "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}, "$ref": "#/$defs/node"},
     {"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 4}]}]}, {"v": 1, "kids": [{"w": 2}]}),
    ("additional_false", {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"},
                          "b": {"type": "integer"}}, "additionalProperties": False}, {"a": 1, "b": 2}, {"a": 1, "c": 2}),
    ("additional_schema", {"type": "object", "additionalProperties": {"type": "integer"}}, {"x": 1, "y": 2}, {"x": "1"}),
    ("const", {"type": "object", "required": ["version"], "properties": {"version": {"const": 2}}}, {"version": 2},
     {"version": 3}),
    ("nullable_type_list", {"type": "object", "required": ["note"], "properties": {"note": {"type": ["string", "null"]}}},
     {"note": None}, {"note": 5}),
    ("prefix_items", {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
     ["a", 1], ["a", "b"]),
    ("unique_items", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [1, 2], [1, 1]),
    ("tool_call", {"type": "object", "required": ["name", "arguments"], "additionalProperties": False, "properties": {
        "name": {"const": "get_weather"}, "arguments": {"type": "object", "required": ["city"], "additionalProperties": False,
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}, "days": {"type": "integer",
                           "minimum": 1, "maximum": 14}}}}},
     {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C", "days": 3}},
     {"name": "get_weather", "arguments": {"city": "Paris", "days": 30}}),
    ("free_text", {"type": "object", "required": ["title", "summary"], "additionalProperties": False, "properties": {
        "title": {"type": "string", "maxLength": 80}, "summary": {"type": "string"}}},
     {"title": "Streaming a 1.56 TB model", "summary": FREE_TEXT}, {"title": "x" * 81, "summary": ""}),
    ("json_object", OBJ, {"any": [1, "two", None, {"3": 4.5e-3}], "ok": True}, [1, 2]),
    ("any_json", {}, [1, "two", None, {"3": -4.5e-3}], "{unquoted"),  # invalid given as raw text
]

# raw texts at JSON's edges: (schema, text); the expected verdict is json.loads + jsonschema's
EDGES = [
    ("string_length", b'{"s":"a\x01bc"}'), ("optional_fields", b'{"name":"A\x01"}'), ("string_length", b'{"s":"a\\"bc"}'),
    ("string_pattern", b'{"code":"ABC-12345"}'), ("json_object", b'{"a":"x\x7f"}'),
    ("json_object", b'{"a":"\\ud83d\\ude00"}'), ("enum_unicode", b'{"city":"\\u6771\\u4eac"}'), ("any_json", b'"x"'),
    ("any_json", b'{"a":1}'), ("number_bounds", b'{"p":1e-1}'), ("number_bounds", b'{"p":-0.0}'),
    ("integer_bounds", b'{"n":01}'), ("integer_bounds", b'{"n":1e2}'), ("array_min_max", b'[1,2,3,4,5]'),
    ("additional_schema", b'{}'), ("optional_fields", b'{"name":"Ada","extra":1}'), ("const", b'{"version":2.0}'),
]


def expected(schema, text: bytes) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).is_valid(value)


def dumps(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


# ---- vocabularies: token bytes by id (None for an id that is special or unused) + specials --------------
class Vocab:
    def __init__(self, name, ranks: dict, specials: dict, n_vocab: int, pattern: str):
        self.name, self.ranks, self.specials, self.n = name, ranks, specials, n_vocab
        self.pattern = pattern
        self.by_id = [None] * n_vocab
        for b, i in ranks.items():
            self.by_id[i] = b
        self.stops = [specials[s] for s in STOPS if s in specials]
        self.max_len = max(len(b) for b in ranks)
        h = hashlib.sha256()
        for i, b in enumerate(self.by_id):
            h.update(b"%d:" % i + (b if b is not None else b"<special>") + b"\n")
        self.sha = h.hexdigest()[:16]


def demo_vocab(model_dir: Path) -> Vocab:
    ranks = {}
    for line in (model_dir / "tiktoken.model").read_bytes().splitlines():
        if line.strip():
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    specials = {v["content"]: int(k) for k, v in cfg["added_tokens_decoder"].items()}
    n = json.loads((model_dir / "config.json").read_text()).get("vocab_size") or 0
    n = max(n, max(ranks.values()) + 1, max(specials.values()) + 1)
    return Vocab(model_dir.name, ranks, specials, n, K3_PAT_STR)


def synthetic_vocab(size: int = K3_VOCAB, n_special: int = 256) -> Vocab:
    """256 single bytes + the most frequent pre-tokenizer pieces of this Python's own stdlib sources and
    their prefixes / suffixes (count descending, then bytes) + n_special specials: BPE-like, deterministic
    for one Python build; its sha256 is printed. Unlike K3's it has almost no CJK tokens."""
    piece = re.compile(rb" ?[A-Za-z_]+| ?[0-9]{1,3}| ?[^\sA-Za-z0-9_]+[\r\n]*|\s*[\r\n]+|\s+")
    pieces = collections.Counter()
    for f in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        pieces.update(piece.findall(f.read_bytes()))
    counts = collections.Counter()
    for p, c in pieces.items():
        for i in range(2, len(p) + 1):
            counts[p[:i]] += c * (3 if i == len(p) else 1)  # whole pieces first
        for i in range(1, len(p) - 1):
            counts[p[i:]] += c
    want = size - 256 - n_special
    chosen = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:want]
    if len(chosen) < want:
        raise SystemExit(f"only {len(chosen)} pieces in the stdlib sources, {want} wanted")
    ranks = {bytes([b]): b for b in range(256)}
    for b, _ in chosen:
        ranks[b] = len(ranks)
    names = list(STOPS) + ["[BOS]", "<|open|>", "<|sep|>", "<|end_of_msg|>"]
    names += [f"<|reserved_{i}|>" for i in range(n_special - len(names))]
    specials = {s: len(ranks) + i for i, s in enumerate(names)}
    return Vocab("synthetic-163840", ranks, specials, size, SIMPLE_PAT_STR)


K3_PAT_STR = None  # filled from k3core when importable (read-only), else the o200k-like pattern below
SIMPLE_PAT_STR = r"""[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


# ---- the two libraries behind one small interface ----------------------------------------------------
def stub_modules(names):
    class Any_:
        def __init__(self, *a, **k):
            pass

    class Mod(types.ModuleType):
        def __getattr__(self, n):
            if n.startswith("__"):
                raise AttributeError(n)
            cls = type(n, (Any_,), {})
            setattr(self, n, cls)
            return cls

    for n in names:
        sys.modules.setdefault(n, Mod(n))


class LLG:
    name = "llguidance"

    def __init__(self, vocab: Vocab):
        import llguidance
        self.llg = llguidance
        t = time.perf_counter()
        self.tok = llguidance.LLTokenizer.from_tiktoken(
            encoder=vocab.ranks, special_tokens=vocab.specials, pattern=vocab.pattern, eos_token=vocab.stops,
            n_vocab=vocab.n)
        self.tokenizer_s = time.perf_counter() - t

    def compile(self, schema):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTS_LLG)
        m = self.llg.LLMatcher(self.tok, grammar, log_level=0)  # the compile: a fresh matcher
        if m.is_error():
            raise ValueError(m.get_error())
        return m, "; ".join(m.get_grammar_warnings())

    def matcher(self, compiled):
        return compiled.deep_copy()

    def mask(self, m) -> bytes:
        return m.compute_bitmask()

    def advance(self, m, token):
        if not m.consume_token(token):
            raise RuntimeError(m.get_error())

    def version(self):
        from importlib.metadata import version
        return version("llguidance")


class XGR:
    name = "xgrammar"

    def __init__(self, vocab: Vocab, threads: int):
        if "torch" not in sys.modules:
            try:
                import torch  # noqa: F401
            except ImportError:
                import tvm_ffi  # noqa: F401  (first: it probes for torch when torch is importable)
                stub_modules(["torch", "torch.utils", "torch.utils.cpp_extension", "transformers"])
        import xgrammar
        self.xgr = xgrammar
        t = time.perf_counter()
        encoded = [b if b is not None else b"" for b in vocab.by_id]  # "" marks a special / unused id
        self.info = xgrammar.TokenizerInfo(encoded, xgrammar.VocabType.RAW, vocab_size=vocab.n,
                                           stop_token_ids=vocab.stops)
        self.compiler = xgrammar.GrammarCompiler(self.info, max_threads=threads, cache_enabled=False)
        self.tokenizer_s = time.perf_counter() - t
        self.buf = np.zeros((1, (vocab.n + 31) // 32), dtype=np.int32)

    def compile(self, schema):
        if schema == {}:  # any JSON value
            return self.compiler.compile_builtin_json_grammar(), "builtin json grammar"
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                 separators=(",", ":"), strict_mode=True), ""

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def mask(self, m) -> bytes:
        self.buf.fill(0)
        m.fill_next_token_bitmask(self.buf)
        return self.buf.tobytes()

    def advance(self, m, token):
        if not m.accept_token(token):
            raise RuntimeError(f"token {token} refused")

    def version(self):
        from importlib.metadata import version
        return version("xgrammar")


# ---- driving one generation under the mask -----------------------------------------------------------
def allowed(mask: np.ndarray, token: int) -> bool:
    return bool((mask[token >> 3] >> (token & 7)) & 1)


def drive(lib, vocab: Vocab, compiled, target: bytes, timings=None, digests=None, masks=None):
    """Feeds `target` through a fresh matcher, each step taking the longest token that the mask allows and
    that the remaining bytes start with, then a stop token. Returns (accepted, tokens, where it stopped).
    Each mask is computed twice and compared by bytes (raises on a difference)."""
    m = lib.matcher(compiled)
    pos, n_tokens = 0, 0
    while True:
        t0 = time.perf_counter()
        raw = lib.mask(m)
        t1 = time.perf_counter()
        if lib.mask(m) != raw:
            raise SystemExit(f"{lib.name}: two masks of one state differ ({vocab.name}, step {n_tokens})")
        mask = np.frombuffer(raw, dtype=np.uint8)
        if digests is not None:
            digests.update(raw[: (vocab.n + 7) // 8])
        if masks is not None:
            masks.append(np.unpackbits(mask, bitorder="little")[: vocab.n])
        if pos == len(target):
            ok = any(allowed(mask, s) for s in vocab.stops)
            if ok:
                lib.advance(m, next(s for s in vocab.stops if allowed(mask, s)))
            return ok, n_tokens, pos
        choice = None
        for length in range(min(vocab.max_len, len(target) - pos), 0, -1):
            tid = vocab.ranks.get(target[pos:pos + length])
            if tid is not None and allowed(mask, tid):
                choice = tid
                break
        if choice is None:
            return False, n_tokens, pos
        t2 = time.perf_counter()
        lib.advance(m, choice)
        t3 = time.perf_counter()
        if timings is not None:
            timings["mask"].append(t1 - t0)
            timings["advance"].append(t3 - t2)
        pos += len(vocab.by_id[choice])
        n_tokens += 1


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else float("nan")


def run_library(lib, vocab: Vocab, rounds: int):
    rows, timings, digests = [], {"mask": [], "advance": []}, hashlib.sha256()
    compile_s = []
    for name, schema, good, bad in SCHEMAS:
        row = {"schema": name}
        try:
            t = time.perf_counter()
            compiled, note = lib.compile(schema)
            compile_s.append(time.perf_counter() - t)
            row.update(compiles=True, compile_ms=compile_s[-1] * 1e3, note=note, compiled=compiled)
        except Exception as e:  # noqa: BLE001  (any failure to compile is the result)
            row.update(compiles=False, error=f"{type(e).__name__}: {str(e)[:300]}")
            rows.append(row)
            continue
        per, row["masks"] = {"mask": [], "advance": []}, []
        for r in range(rounds):
            ok, n, _ = drive(lib, vocab, compiled, dumps(good), per, digests, row["masks"] if r == 0 else None)
        bad_bytes = bad.encode() if name == "any_json" else dumps(bad)
        bad_passes, _, at = drive(lib, vocab, compiled, bad_bytes)
        row.update(valid_passes=ok, tokens=n, invalid_blocked=not bad_passes,
                   blocked_at=bad_bytes[:at + 1].decode(errors="replace") if not bad_passes else None,
                   mask_ms_median=statistics.median(per["mask"]) * 1e3 if per["mask"] else None,
                   mask_ms_max=max(per["mask"]) * 1e3 if per["mask"] else None)
        for k in timings:
            timings[k] += per[k]
        specials = np.array(sorted(vocab.specials.values()))  # allowed before the end of the text?
        row["special_leaks"] = sum(bool(m[specials].any()) for m in row["masks"][:-1])
        rows.append(row)
    edges = []
    for name, text in EDGES:
        row = next(r for r in rows if r["schema"] == name)
        if row["compiles"]:
            schema = next(x[1] for x in SCHEMAS if x[0] == name)
            want, got = expected(schema, text), drive(lib, vocab, row.pop("compiled"), text)[0]
            row["compiled"] = lib.compile(schema)[0]
            edges.append({"schema": name, "text": text.decode(errors="replace"), "json_valid": want, "passes": got})
    for r in rows:
        r.pop("compiled", None)
    summary = {"tokenizer_build_s": lib.tokenizer_s, "edges_agree": sum(e["json_valid"] == e["passes"] for e in edges),
               "edges": len(edges), "schemas": len(SCHEMAS),
               "compile": sum(r["compiles"] for r in rows),
               "valid_pass": sum(bool(r.get("valid_passes")) for r in rows),
               "invalid_blocked": sum(bool(r.get("invalid_blocked")) for r in rows),
               "special_ids_allowed_inside_text": sum(r.get("special_leaks", 0) for r in rows),
               "compile_ms_median": statistics.median(compile_s) * 1e3, "compile_ms_max": max(compile_s) * 1e3,
               "tokens_timed": len(timings["mask"]),
               "mask_ms_median": statistics.median(timings["mask"]) * 1e3, "mask_ms_p99": pct(timings["mask"], 99) * 1e3,
               "advance_ms_median": statistics.median(timings["advance"]) * 1e3,
               "advance_ms_p99": pct(timings["advance"], 99) * 1e3, "mask_digest": digests.hexdigest()[:16]}
    return rows, summary, edges


def compare_masks(vocab, runs):
    """Along the same valid instance, where do the two libraries' masks differ? (Ids allowed by one only.)"""
    print(f"\n### masks compared along each valid instance ({vocab.name})\n")
    print("| schema | steps | steps with equal masks | example ids allowed by one library only |")
    print("|---|---|---|---|")
    (a, b), names = [run["rows"] for run in runs], [run["summary"]["library"] for run in runs]
    for ra, rb in zip(a, b):
        ma, mb = ra.get("masks"), rb.get("masks")
        if not ma or not mb or len(ma) != len(mb):
            continue
        same = sum(np.array_equal(x, y) for x, y in zip(ma, mb))
        example = ""
        for x, y in zip(ma, mb):
            if not np.array_equal(x, y):
                only_a = [int(i) for i in np.flatnonzero(x & ~y)[:3]]
                only_b = [int(i) for i in np.flatnonzero(y & ~x)[:3]]
                show = lambda ids: ", ".join(repr(vocab.by_id[i]) if vocab.by_id[i] is not None else f"special {i}"
                                             for i in ids)
                example = f"{names[0]} only: {show(only_a)}; {names[1]} only: {show(only_b)}"
                break
        print(f"| {ra['schema']} | {len(ma)} | {same} | {example} |")


def threads_now() -> int:
    return int(next(line for line in open("/proc/self/status") if line.startswith("Threads:")).split()[1])


def main():
    global K3_PAT_STR
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEMO, help="a directory with tiktoken.model + tokenizer_config.json")
    ap.add_argument("--vocab", choices=["demo", "synthetic", "both"], default="both",
                    help="demo: the vocabulary of --model; synthetic: 163,840 byte strings from the stdlib sources")
    ap.add_argument("--libs", default="llguidance,xgrammar")
    ap.add_argument("--rounds", type=int, default=3, help="generations timed per schema")
    ap.add_argument("--xgr-threads", type=int, default=1, help="xgrammar GrammarCompiler max_threads (its default: 8)")
    ap.add_argument("--json", type=Path, help="write every row here")
    args = ap.parse_args()
    for s in SCHEMAS:  # the instances themselves are checked against the schemas by jsonschema first
        checker = jsonschema.FormatChecker()
        jsonschema.validate(s[2], s[1], format_checker=checker)
        if s[0] != "any_json" and jsonschema.Draft202012Validator(s[1], format_checker=checker).is_valid(s[3]):
            raise SystemExit(f"{s[0]}: the 'invalid' instance is valid")
    try:
        sys.path.insert(0, str(DEMO.parent.parent.parent))
        from k3core.text.tokenizer import PAT_STR  # read-only: the pre-split pattern k3 uses
        K3_PAT_STR = PAT_STR
    except Exception:  # noqa: BLE001  (k3core's own deps need not be in this venv)
        K3_PAT_STR = SIMPLE_PAT_STR
    finally:
        sys.path.pop(0)
    vocabs = []
    if args.vocab in ("demo", "both"):
        vocabs.append(demo_vocab(args.model))
    if args.vocab in ("synthetic", "both"):
        t = time.perf_counter()
        vocabs.append(synthetic_vocab())
        print(f"synthetic vocabulary built in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    out = {"python": sys.version.split()[0], "cpus": os.cpu_count(), "runs": []}
    for vocab in vocabs:
        print(f"\n## vocabulary {vocab.name}: {vocab.n} ids, {len(vocab.ranks)} byte strings, "
              f"{len(vocab.specials)} specials, stops {vocab.stops}, sha256 {vocab.sha}, "
              f"pre-split pattern: {'k3core PAT_STR' if vocab.pattern == K3_PAT_STR != SIMPLE_PAT_STR else 'simple'}")
        for lib_name in args.libs.split(","):
            before = threads_now()
            lib = LLG(vocab) if lib_name == "llguidance" else XGR(vocab, args.xgr_threads)
            rows, summary, edges = run_library(lib, vocab, args.rounds)
            summary.update(library=lib.name, version=lib.version(), vocabulary=vocab.name, vocab_sha=vocab.sha,
                           threads_before=before, threads_after=threads_now())
            out["runs"].append({"summary": summary, "rows": rows, "edges": edges})
            print(f"\n### {lib.name} {summary['version']} on {vocab.name}\n")
            print("| schema | compiles | compile ms | valid passes (tokens) | invalid blocked at | mask ms median |")
            print("|---|---|---|---|---|---|")
            for r in rows:
                if not r["compiles"]:
                    print(f"| {r['schema']} | **no**: {r['error'][:160]} | | | | |")
                    continue
                blocked = f"`{r['blocked_at']}`" if r["invalid_blocked"] else "**not blocked**"
                print(f"| {r['schema']} | yes | {r['compile_ms']:.1f} | {'yes' if r['valid_passes'] else '**no**'} "
                      f"({r['tokens']}) | {blocked} | {r['mask_ms_median'] or 0:.3f} |")
            print("\n| schema | text | valid JSON for the schema | passes the mask |\n|---|---|---|---|")
            for e in edges:
                flag = "" if e["json_valid"] == e["passes"] else " **differs**"
                print(f"| {e['schema']} | `{e['text']!r}` | {e['json_valid']} | {e['passes']}{flag} |")
            print("\n" + json.dumps(summary))
        if len(args.libs.split(",")) == 2:
            compare_masks(vocab, out["runs"][-2:])
        for run in out["runs"]:
            for r in run["rows"]:
                r.pop("masks", None)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
