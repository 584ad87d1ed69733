"""`k3 bench structured`: what the structured-output mask costs per token, against the same generation's
forward passes (issue 25). For each schema of k3core.testing.schemas, one greedy instruct chat reply held to
it, timing in the same run: the grammar's compile (Grammar construction), every mask (`Constraint.apply`)
and advance, and every forward pass (`Engine.forward`, timed around the call); also the one-off build of
llguidance's view of the vocabulary. Each reply must parse with json.loads and validate with jsonschema.

Not a test of speed: it asserts nothing about time. A finished reply that breaks its schema is exit 4.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone

import numpy as np

DEFAULT_MAX_TOKENS = 256


class TimedConstraint:
    """A structured.Constraint whose masks (apply) and advances are timed, seconds per call in order."""

    def __init__(self, constraint):
        self.constraint, self.mask_seconds, self.advance_seconds = constraint, [], []

    def apply(self, logits: np.ndarray) -> np.ndarray:
        started = time.perf_counter()
        masked = self.constraint.apply(logits)
        self.mask_seconds.append(time.perf_counter() - started)
        return masked

    def advance(self, token: int) -> None:
        started = time.perf_counter()
        self.constraint.advance(token)
        self.advance_seconds.append(time.perf_counter() - started)


class TimedGrammar:
    """A structured.Grammar for Session.generate whose one constraint is a TimedConstraint."""

    def __init__(self, grammar):
        self.grammar, self.stop_ids, self.timed = grammar, grammar.stop_ids, None

    def constraint(self) -> TimedConstraint:
        self.timed = TimedConstraint(self.grammar.constraint())
        return self.timed


class ForwardClock:
    """The engine, with each `forward` call timed (seconds per call, in order); the rest is the engine's."""

    def __init__(self, engine):
        self.engine, self.seconds = engine, []

    def forward(self, *args, **kwargs):
        started = time.perf_counter()
        logits = self.engine.forward(*args, **kwargs)
        self.seconds.append(time.perf_counter() - started)
        return logits

    def __getattr__(self, name):
        return getattr(self.engine, name)


def ms(seconds: list[float], q: float | None = None) -> float | None:
    """The median (or the q-th percentile) of `seconds`, in milliseconds; None when there are none."""
    if not seconds:
        return None
    return 1e3 * (statistics.median(seconds) if q is None else float(np.percentile(seconds, q)))


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def validation(text: str, schema: dict, finished: bool) -> str:
    """"valid", "invalid: why", "cut off" (no stop id within --max-tokens) or "not validated" (no jsonschema)."""
    if not finished:
        return "cut off"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"invalid: not JSON ({exc})"
    try:
        import jsonschema  # a test dependency, not k3's: without it replies are parsed, not validated
    except ImportError:
        return "not validated"
    validator = jsonschema.validators.validator_for(schema)(schema, format_checker=jsonschema.FormatChecker())
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    return "valid" if error is None else f"invalid: {error.message}"


def vocabulary_ms(tokenizer) -> float:
    """Building llguidance's view of `tokenizer` (once per tokenizer: later grammars reuse it), in ms."""
    import llguidance  # noqa: F401  (imported first: its import is not the build)

    from ...generation.structured import _Vocabulary

    started = time.perf_counter()
    _Vocabulary.of(tokenizer, chat=True)
    return 1e3 * (time.perf_counter() - started)


def measure_schema(engine, tokenizer, name: str, description: str, schema: dict, max_tokens: int) -> dict:
    """One greedy instruct reply to a fresh conversation, held to `schema`: its timings and its validation."""
    from ...api import Conversation, SamplingParams, Session
    from ...generation.structured import Grammar
    from ...generation.structured import schema_text
    from ...generation.structured import reply_grammar

    started = time.perf_counter()
    grammar = TimedGrammar(Grammar(tokenizer, reply_grammar(schema_text(schema), "response")))
    compile_ms = 1e3 * (time.perf_counter() - started)
    conv, clock = Conversation(tokenizer, "instruct"), ForwardClock(engine)
    conv.add_user(f"Reply with JSON: {description}.")
    done = [e for e in Session(clock, tokenizer).generate(conv.prompt(), SamplingParams(max_tokens=max_tokens),
                                                          stop_ids=sorted(conv.stop_ids), channel="response",
                                                          grammar=grammar) if e.kind == "done"][0]
    reply = conv.add_reply(done.ids)
    passes = done.stats["decode_passes"]
    timed, forward = grammar.timed, clock.seconds[len(clock.seconds) - passes:]  # the prompt's passes come first
    mask_ms, forward_ms = ms(timed.mask_seconds), ms(forward)
    return {"schema": name, "description": description, "tokens": len(done.ids), "reason": done.reason,
            "compile_ms": compile_ms, "mask_ms": mask_ms, "mask_p99_ms": ms(timed.mask_seconds, 99),
            "mask_max_ms": 1e3 * max(timed.mask_seconds), "advance_ms": ms(timed.advance_seconds),
            "forward_ms": forward_ms, "decode_passes": passes, "mask_vs_forward": ratio(mask_ms, forward_ms),
            "reply": reply.content, "validation": validation(reply.content, schema, reply.finished),
            "seconds": {"mask": timed.mask_seconds, "advance": timed.advance_seconds, "forward": forward}}


def totals(rows: list[dict]) -> dict:
    """Every schema's samples pooled; `constraint_share`: all mask and advance time over all forward time."""
    pooled = {k: [s for r in rows for s in r["seconds"][k]] for k in ("mask", "advance", "forward")}
    mask_ms, forward_ms = ms(pooled["mask"]), ms(pooled["forward"])
    compiles = [r["compile_ms"] for r in rows]
    return {"schemas": len(rows), "tokens": sum(r["tokens"] for r in rows), "compile_ms": statistics.median(compiles),
            "compile_max_ms": max(compiles), "mask_ms": mask_ms, "mask_p99_ms": ms(pooled["mask"], 99),
            "mask_max_ms": 1e3 * max(pooled["mask"]), "advance_ms": ms(pooled["advance"]), "forward_ms": forward_ms,
            "decode_passes": len(pooled["forward"]), "mask_vs_forward": ratio(mask_ms, forward_ms),
            "constraint_share": ratio(sum(pooled["mask"]) + sum(pooled["advance"]), sum(pooled["forward"])),
            "valid": sum(r["validation"] == "valid" for r in rows)}


def chosen_schemas(names: str | None) -> list[tuple[str, str, dict]]:
    from ...errors import UsageError
    from ...testing.schemas import SCHEMAS

    if names is None:
        return SCHEMAS
    by_name = {s[0]: s for s in SCHEMAS}
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in by_name]
    if unknown or not wanted:
        raise UsageError(f"--schemas {names!r}: unknown {', '.join(unknown) or 'nothing named'}; the schemas are "
                         + ", ".join(by_name))
    return [by_name[n] for n in wanted]


def measure(args) -> dict:
    from importlib.metadata import version

    from ...api import load_tokenizer
    from ...machine.rates import machine_info
    from ..options import engine_config_from_args, open_engine

    schemas = chosen_schemas(args.schemas)
    config, date = engine_config_from_args(args, tuned=False), datetime.now(timezone.utc).isoformat(timespec="seconds")
    with open_engine(config) as engine:
        tokenizer = load_tokenizer(config.tokenizer or config.model)
        vocab_ms = vocabulary_ms(tokenizer)
        rows = []
        for name, description, schema in schemas:
            print(f"  {name} …", file=sys.stderr, flush=True)
            rows.append(measure_schema(engine, tokenizer, name, description, schema, args.max_tokens))
        kernels = engine.kernels.name
    return {"model": str(config.model), "vocabulary": tokenizer.vocab_size, "vocabulary_ms": vocab_ms,
            "kernels": kernels, "llguidance": version("llguidance"), "machine": machine_info(),
            "date": date, "max_tokens": args.max_tokens,
            "schemas": rows, "totals": totals(rows)}


def _f(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.3g} %"


def structured_table(doc: dict) -> str:
    m = doc["machine"]
    out = [f"the mask's cost on {doc['model']} ({doc['vocabulary']:,} ids), {m['cpu']}, {m['cores']} cores, kernels "
           f"{doc['kernels']}, llguidance {doc['llguidance']}, {doc['date']}; one greedy instruct reply per schema",
           f"vocabulary build (once per tokenizer): {doc['vocabulary_ms']:.1f} ms; mask = Constraint.apply "
           "(bitmask and -inf on the logits), forward = one decode pass (Engine.forward)", "",
           "| schema | tokens | compile ms | mask ms median | mask ms p99 | advance ms median | forward ms median "
           "| mask ÷ forward | reply |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in [*doc["schemas"], {**doc["totals"], "schema": "**all**", "validation": ""}]:
        check = r["validation"] or f"{doc['totals']['valid']} of {doc['totals']['schemas']} valid"
        out.append(f"| {r['schema']} | {r['tokens']} | {r['compile_ms']:.2f} | {_f(r['mask_ms'], '.4f')} | "
                   f"{_f(r['mask_p99_ms'], '.4f')} | {_f(r['advance_ms'], '.4f')} | {_f(r['forward_ms'], '.2f')} | "
                   f"{_pct(r['mask_vs_forward'])} | {check} |")
    t = doc["totals"]
    out += ["", f"all masks and advances of the run: {_pct(t['constraint_share'])} of its forward time "
                f"({t['decode_passes']} decode passes); the worst mask {t['mask_max_ms']:.3f} ms"]
    return "\n".join(out)


def cmd_structured(args) -> int:
    from ...errors import UnsoundRunError, UsageError

    if args.max_tokens < 1:
        raise UsageError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    doc = measure(args)
    print(json.dumps(doc, indent=1, ensure_ascii=False) if args.json else structured_table(doc))
    broken = [f"{r['schema']}: {r['validation']} ({r['reply']!r})" for r in doc["schemas"]
              if r["validation"].startswith("invalid")]
    if broken:
        raise UnsoundRunError("a reply held to its schema does not satisfy it:\n  " + "\n  ".join(broken))
    return 0


def add_parser(sub) -> None:
    from ..options import add_engine_arguments

    p = sub.add_parser(
        "structured", help="the structured-output mask's cost per token against the forward pass, per schema",
        formatter_class=argparse.RawDescriptionHelpFormatter, description=__doc__.split("\n\n")[0],
        epilog="examples:\n"
               "  k3 bench structured wizard/data/demo-model                  # the 22 schemas on the demo model\n"
               "  k3 bench structured wizard/data/demo-model --schemas enum_top,integer_bounds\n"
               "  k3 make-model /tmp/k3-wide --shape wide && k3 bench structured /tmp/k3-wide   # real K3 widths\n"
               "  k3 bench structured /tmp/k3-wide --json | jq .totals         # the document, every timing included\n"
               "reading it: mask ÷ forward is the median mask over the median decode pass of the same run; a K3\n"
               "forward pass takes seconds (docs/STRUCTURED-OUTPUT.md, \"The mask's cost, measured\").")
    add_engine_arguments(p)
    p.add_argument("--schemas", metavar="NAME,…", help="only these schemas of k3core/testing/schemas.py (default: all)")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, metavar="N",
                   help=f"ids per reply at most (default {DEFAULT_MAX_TOKENS}; every schema is bounded, so replies "
                        "finish well before)")
    p.add_argument("--json", action="store_true", help="print the JSON document, every timing included, instead of "
                   "the table")
    p.set_defaults(func=cmd_structured)
