"""Evaluate the demo model with the k3 engine itself (no torch): greedy chat, one fresh ChatSession per
question, accuracy per category (exact = the whole reply; contains = the key fact is in it).

    .venv/bin/python demo/evaluate.py [MODEL_DIR] [--seed 0] [--limit N] [--write-provenance] [--show-failures 5]

MODEL_DIR defaults to wizard/data/demo-model. The questions come from demo/corpus.py with the seed the
model was trained with: in-distribution (a fixed sample of the trained phrasings), held-out
(country, phrasing) pairs, capital questions in templates never trained on, unseen number pairs,
out-of-domain questions with unseen fillers and templates, greetings and identity, and a few questions
in thinking mode. --write-provenance stores the table in the model's k3-demo-model.json (and
refreshes SHA256SUMS).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402

from k3core import ChatSession, EngineConfig, SamplingParams, load_tokenizer, open_engine  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "wizard" / "data" / "demo-model"
HEADLINE = "What is the capital of France?"


def categories(data: dict, limit: int | None) -> dict[str, list[dict]]:
    cats: dict[str, list[dict]] = {}
    for c in data["eval_train"]:
        cats.setdefault(f"in-distribution/{c['category']}", []).append(c)
    cats["held-out (country, phrasing) pairs"] = data["heldout_capital"]
    cats["held-out: capital phrasings never trained"] = data["new_phrasing"]
    cats["held-out: unseen number pairs"] = data["heldout_arith"]
    cats["out-of-domain (unseen) -> I don't know"] = data["ood_eval"]
    for c in data["small_talk"]:
        cats.setdefault(f"small talk/{c['category']}", []).append(c)
    thinking = [c for c in data["eval_train"] if c["category"] in ("capital", "arith")][:30]
    cats["thinking mode (capital, arithmetic)"] = [{**c, "mode": "thinking"} for c in thinking]
    if limit:
        cats = {k: v[:limit] for k, v in cats.items()}
    return cats


def ask(engine, tok, question: str, mode: str = "instruct", max_tokens: int = 40) -> tuple[str, bool]:
    chat = ChatSession(engine, tok, mode=mode)
    for _ in chat.ask(question, SamplingParams(max_tokens=max_tokens)):
        pass
    return chat.last["answer"], chat.last["reason"] == "stop id"


def evaluate(model_dir: Path, seed: int, limit: int | None, show_failures: int, threads: int = 1) -> dict:
    data = corpus.build(seed)
    tok = load_tokenizer(model_dir)
    results = {}
    t0 = time.time()
    with open_engine(EngineConfig(str(model_dir), threads=threads)) as engine:
        answer, _ = ask(engine, tok, HEADLINE)
        print(f"{HEADLINE!r} -> {answer!r}")
        results["headline"] = {"question": HEADLINE, "answer": answer, "ok": "Paris" in answer}
        print(f"{'category':46s} {'n':>4s} {'exact':>7s} {'contains':>9s}")
        for name, convs in categories(data, limit).items():
            exact = contains = 0
            failures = []
            for c in convs:
                q = c["messages"][0]["content"]
                reply, finished = ask(engine, tok, q, c["mode"])
                e, k = finished and reply == c["expect"], c["key"] in reply
                exact += e
                contains += k
                if not e and len(failures) < show_failures:
                    failures.append((q, reply))
            n = len(convs)
            results[name] = {"n": n, "exact": round(exact / n, 4), "contains": round(contains / n, 4)}
            print(f"{name:46s} {n:4d} {100 * exact / n:6.1f}% {100 * contains / n:8.1f}%", flush=True)
            for q, r in failures:
                print(f"      {q!r} -> {r!r}")
    results["seconds"] = round(time.time() - t0, 1)
    print(f"{results['seconds']} s")
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--seed", type=int, default=None, help="corpus seed (default: the model's, from k3-demo-model.json)")
    ap.add_argument("--limit", type=int, default=None, help="at most N questions per category")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--show-failures", type=int, default=3)
    ap.add_argument("--write-provenance", action="store_true")
    args = ap.parse_args()
    marker = args.model / "k3-demo-model.json"
    prov = json.loads(marker.read_text()) if marker.exists() else {}
    seed = args.seed if args.seed is not None else prov.get("seed", 0)
    results = evaluate(args.model, seed, args.limit, args.show_failures, args.threads)
    if args.write_provenance:
        prov["k3_engine_accuracy"] = {
            "command": "python demo/evaluate.py " + str(args.model.relative_to(ROOT) if args.model.is_absolute()
                                                        and ROOT in args.model.parents else args.model),
            **results}
        marker.write_text(json.dumps(prov, indent=1) + "\n")
        lines = [f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}\n"
                 for f in sorted(args.model.iterdir()) if f.is_file() and f.name != "SHA256SUMS"]
        (args.model / "SHA256SUMS").write_text("".join(lines))
        print(f"wrote {marker} and SHA256SUMS")
    if not results["headline"]["ok"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
