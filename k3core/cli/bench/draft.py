"""`k3 bench draft`: how often a draft model (k3core/model/engine.py DraftModel: the model on a draft trunk that
`k3 pack --draft` derived, with fewer routed experts per token) picks the model's own next id, teacher-forced on
transcripts, and what a forward of it costs beside the model's — what a `self` draft source lives on (issue 40).

Per turn of the chosen kinds of the transcripts (rendered with the model's tokenizer and chat template, as `k3 bench
drafts --transcripts` does), its prompt and reply ids are forwarded once by the model and once by the draft model at
each --top-k, each from a fresh state with every position's logits; agreement is the share of the reply's positions
(those after the prompt) where both pick the same id by argmax. The forwards' seconds per id are timed in the same
run, so the draft's cost is a ratio to the model's.

Not a test: it measures and prints; it asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from ...errors import UsageError
from ...model.observer import Observer
from ...units import human

REPO = Path(__file__).resolve().parents[3]  # k3core/cli/bench/draft.py -> the repository
MAX_TURNS = 1000  # --turns: a bench, not a corpus pass


def top_ks(text: str | None, most: int) -> list[int]:
    """--top-k "1,2,4" as integers in 1..most; None: the model's own, half of it and 1."""
    if text is None:
        return sorted({most, max(1, most // 2), 1}, reverse=True)
    try:
        ks = [int(k) for k in text.split(",")]
    except ValueError:
        ks = [0]
    if not ks or min(ks) < 1 or max(ks) > most:
        raise UsageError(f"--top-k takes routed experts per token in 1..{most} (this model routes to {most}), "
                         f"comma-separated; got {text!r}")
    return ks


def timed_logits(model, ids) -> tuple[np.ndarray, float]:
    start = time.perf_counter()
    logits = model.logits(ids)
    return logits, time.perf_counter() - start


def measure(engine, draft, ks: list[int], turns) -> dict:
    """Agreement and seconds per id of the draft model at each of `ks` against `engine` on `turns`."""
    from ...model.draft_weights import DraftPlacer
    from ...model.engine import DraftModel

    rows = {k: {"agreed": 0, "positions": 0, "seconds": 0.0} for k in ks}
    exact_seconds = ids = 0
    weights = DraftPlacer(engine.placer, draft, engine.config.num_hidden_layers)  # read once for every top-k
    models = {k: DraftModel(engine, weights, k) for k in ks}
    for t in turns:
        whole = [*t.prompt, *t.reply]
        want, seconds = timed_logits(engine, whole)
        exact_seconds, ids = exact_seconds + seconds, ids + len(whole)
        picked = want[len(t.prompt) - 1:-1].argmax(axis=1)  # the model's pick at each reply position
        for k, model in models.items():
            got, seconds = timed_logits(model, whole)
            rows[k]["agreed"] += int((got[len(t.prompt) - 1:-1].argmax(axis=1) == picked).sum())
            rows[k]["positions"] += len(t.reply)
            rows[k]["seconds"] += seconds
    return {"ids": ids, "exact_seconds_per_id": exact_seconds / ids,
            "rows": [{"top_k": k, "agreement": r["agreed"] / r["positions"], **r, "seconds_per_id": r["seconds"] / ids,
                      "vs_exact": r["seconds"] / exact_seconds} for k, r in rows.items()]}


def first_questions(conversations, turns: int) -> list[str]:
    """The first user message of each conversation, at most `turns` of them: what a person opens a chat with."""
    out = [next((m["content"] for m in c.messages if m["role"] == "user" and isinstance(m["content"], str)), None)
           for c in conversations]
    return [q for q in out if q][:turns]


class Drafts(Observer):
    """Counts drafted and accepted ids."""

    drafted = accepted = 0

    def on_draft(self, drafted: int, accepted: int) -> None:
        self.drafted, self.accepted = self.drafted + drafted, self.accepted + accepted


def answer(engine, prompt: list[int], stop: set[int], gen: int, spec) -> tuple[list[int], int, Drafts]:
    """Greedy ids after `prompt` up to a stop id or `gen` of them, the passes that took, and the drafts counted."""
    from ...api import generate_ids

    counted, passes = Drafts(), engine.forward_passes
    ids, steps = [], generate_ids(engine, prompt, engine.new_state(), observers=[counted], speculation=spec)
    for token, _ in steps:
        ids.append(token)
        if token in stop or len(ids) >= gen:
            break
    steps.close()
    return ids, engine.forward_passes - passes, counted


def live(engine, ks: list[int], questions: list[str], tokenizer, gen: int, speculate: int) -> dict:
    """Each question (rendered with the chat template) answered serially, with `suffix` and with `self` at each of
    `ks` routed experts, K = `speculate` and auto, at the id level (a --tokenizer other than the model's need not
    decode what the model emits): ids, passes (the prompt's included: it emits the first id), drafts proposed and
    accepted, seconds, and whether the ids are the serial ones. The engine's draft model is swapped per top-k (one set
    of weights)."""
    from ...api import Conversation, speculation
    from ...generation.generate import AUTO_K
    from ...model.engine import DraftModel
    from ...generation.session import bytes_read  # the draft model's reads go through the shared store and placer

    weights, most = engine.draft.placer, engine.config.num_experts_per_token
    runs = [("serial", None, None), ("suffix", None, ("suffix", speculate))]
    runs += [(f"{source}, {k} of {most} experts, K={kk}", k, (source, kk)) for k in ks
             for source, kk in (("self", speculate), ("self", "auto"), ("auto", "auto"))]
    rows = {how: {"ids": 0, "passes": 0, "drafted": 0, "accepted": 0, "seconds": 0.0, "same": 0, "read": 0}
            for how, _, _ in runs}
    for q in questions:
        conv = Conversation(tokenizer, "instruct")
        conv.add_user(q)
        prompt, serial = conv.prompt(), None
        for how, k, spec in runs:
            if k is not None:
                engine.draft = DraftModel(engine, weights, k)
            start, read = time.perf_counter(), bytes_read(engine)
            ids, passes, drafts = answer(engine, prompt, conv.stop_ids, gen, speculation(*spec) if spec else None)
            serial, r = serial or ids, rows[how]
            r["seconds"] += time.perf_counter() - start
            r["read"] += bytes_read(engine) - read
            r["ids"], r["passes"], r["same"] = r["ids"] + len(ids), r["passes"] + passes, r["same"] + (ids == serial)
            r["drafted"], r["accepted"] = r["drafted"] + drafts.drafted, r["accepted"] + drafts.accepted
    out = []
    for how, r in rows.items():
        out.append({"run": how, **r, "tokens_per_pass": r["ids"] / r["passes"], "read_per_id": r["read"] / r["ids"],
                    "acceptance": r["accepted"] / r["drafted"] if r["drafted"] else None,
                    "vs_serial_seconds": r["seconds"] / rows["serial"]["seconds"]})
    return {"questions": len(questions), "gen": gen, "speculate": speculate, "auto_k": AUTO_K, "live": out}


def cmd_draft(args) -> int:
    from ...api import EngineConfig, open_engine
    from ...generation.generate import AUTO_K
    from ...format.notes import demo_model_dir
    from ...io.draft_trunk import default_dir, open_draft_trunk
    from .tokenizer import bench_tokenizer
    from .transcripts import read_conversations, scored_turns

    model = Path(args.model) if args.model else demo_model_dir()
    if not 1 <= args.turns <= MAX_TURNS:
        raise UsageError(f"--turns takes 1..{MAX_TURNS}, got {args.turns}")
    kinds = set(args.kinds.split(","))
    conversations = [c for c in read_conversations(args.transcripts) if c.kind in kinds]
    if not conversations:
        raise UsageError(f"--transcripts {args.transcripts} has no conversation of the kinds {args.kinds}")
    tokenizer, _ = bench_tokenizer(args.tokenizer, model)
    if args.live:
        if args.speculate < 1 or args.gen < 1:
            raise UsageError(f"--speculate and --gen take 1 or more, got {args.speculate} and {args.gen}")
        turns, context = first_questions(conversations, args.turns), 4096
    else:
        turns = scored_turns(conversations, tokenizer, args.transcripts)[:args.turns]
        context = max(4096, max(len(t.prompt) + len(t.reply) for t in turns))
    draft_dir = Path(args.draft_dir) if args.draft_dir else default_dir(args.trunk, "int8")
    config = EngineConfig(model, trunk=args.trunk, max_context=context, threads=args.threads, trunk_gb=args.trunk_gb,
                          cache_gb=args.cache_gb)
    if args.live:
        config = config.replace(draft_trunk=draft_dir, speculate=max(args.speculate, AUTO_K))
    with open_engine(config) as engine:
        if tokenizer.vocab_size > engine.config.vocab_size:
            raise UsageError(f"--tokenizer {args.tokenizer}: its {tokenizer.vocab_size} ids do not fit this model's "
                             f"vocabulary of {engine.config.vocab_size}")
        draft = open_draft_trunk(draft_dir, engine.placer.trunk)
        ks = top_ks(args.top_k, engine.config.num_experts_per_token)
        doc = {"model": str(model), "draft": str(draft_dir), "kind": draft.spec.kind, "kinds": sorted(kinds),
               "turns": len(turns), "kernels": engine.kernels.name,
               **(live(engine, ks, turns, tokenizer, args.gen, args.speculate) if args.live
                  else measure(engine, draft, ks, turns))}
    print(json.dumps(doc, indent=1) if args.json else live_table(doc) if args.live else table(doc))
    return 0


def live_table(doc: dict) -> str:
    lines = [f"{doc['kind']} draft ({doc['draft']}) against {doc['model']}, live: the first question of "
             f"{doc['turns']} conversations of {', '.join(doc['kinds'])}, greedy, up to {doc['gen']} ids each "
             f"({doc['kernels']} kernels); auto drafts up to {doc['auto_k']}", "",
             "| run | ids | passes | tokens per pass | drafts accepted | same answer | read per id | time ÷ serial |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["live"]:
        share = f"{r['accepted']} of {r['drafted']} ({100 * r['acceptance']:.0f} %)" if r["drafted"] else "–"
        lines.append(f"| {r['run']} | {r['ids']} | {r['passes']} | {r['tokens_per_pass']:.2f} | {share} | "
                     f"{r['same']} of {doc['turns']} | {human(r['read_per_id'])} | {r['vs_serial_seconds']:.2f} |")
    return "\n".join(lines)


def table(doc: dict) -> str:
    lines = [f"{doc['kind']} draft ({doc['draft']}) against {doc['model']}, teacher-forced on {doc['turns']} turns of "
             f"{', '.join(doc['kinds'])}; the model {1000 * doc['exact_seconds_per_id']:.1f} ms per id forwarded "
             f"({doc['kernels']} kernels)", "",
             "| routed experts per token | agreement | reply positions | ms per id | ÷ the model's |",
             "|---:|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        lines.append(f"| {r['top_k']} | {100 * r['agreement']:.1f} % | {r['positions']} | "
                     f"{1000 * r['seconds_per_id']:.1f} | {r['vs_exact']:.2f} |")
    return "\n".join(lines)


def add_parser(sub) -> None:
    from ..options import GB

    p = sub.add_parser("draft", help="a draft trunk's teacher-forced agreement with the model, and its cost",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description=__doc__.split("\n\n")[1],
                       epilog="examples:\n  k3 pack wizard/data/demo-model /tmp/demo-trunk --draft int8\n"
                              "  k3 bench draft --trunk /tmp/demo-trunk\n"
                              "  k3 bench draft MODEL --trunk TRUNK --draft-dir TRUNK/draft-int4 --top-k 16,8,4 "
                              "--kinds plain,quote --turns 40\n"
                              "  k3 bench draft /tmp/wide --trunk /tmp/wide-trunk --tokenizer wizard/data/demo-model "
                              "--turns 2")
    p.add_argument("model", nargs="?", metavar="MODEL_DIR", help="checkpoint (default: the demo model)")
    p.add_argument("--trunk", required=True, metavar="DIR", help="the packed trunk the draft was derived from")
    p.add_argument("--draft-dir", metavar="DIR", help="the draft trunk (default: TRUNK/draft-int8)")
    p.add_argument("--top-k", metavar="A,B,…", help="routed experts per token of the draft model (default: the "
                   "model's, half of it, 1)")
    p.add_argument("--transcripts", default=str(REPO / "benchmarks" / "transcripts" / "transcripts.jsonl"),
                   metavar="FILE", help="conversations, as `k3 bench drafts --transcripts` reads them")
    p.add_argument("--kinds", default="plain", metavar="A,B", help="kinds of conversation to score (default plain)")
    p.add_argument("--turns", type=int, default=10, metavar="N", help=f"turns scored, 1..{MAX_TURNS} (default 10)")
    p.add_argument("--tokenizer", metavar="DIR", help="render the transcripts with this tokenizer instead of the "
                   "model's (a generated test model has none: e.g. the demo model's, whose 768 ids fit any of them)")
    p.add_argument("--live", action="store_true", help="generate instead: answer each conversation's first "
                   "question serially, with suffix drafts, with the self draft source (K = --speculate and auto) and "
                   "with --draft auto (suffix or self) at each --top-k; tokens per pass, acceptance, disk bytes read "
                   "per id, time, and whether each answer is the serial one")
    p.add_argument("--speculate", type=int, default=4, metavar="K",
                   help="with --live: drafted ids per pass (default 4)")
    p.add_argument("--gen", type=int, default=64, metavar="N", help="with --live: ids per answer at most (default 64)")
    p.add_argument("--trunk-gb", type=GB, metavar="GB", help="RAM for the packed trunk (default: all of it)")
    p.add_argument("--cache-gb", type=GB, metavar="GB", help="RAM for the expert cache (default 1)")
    p.add_argument("--threads", type=int, metavar="N", help="kernel threads (default: every CPU)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_draft)
