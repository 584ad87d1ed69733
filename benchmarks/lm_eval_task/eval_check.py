"""lm-eval's `local-completions` model against a live `k3 serve`, on the 20-question task beside this file, at each
of two memory budgets, with two ways of tokenizing and batching: every number must come out the same. `make
eval-check` runs it (never `make test`).

lm-evaluation-harness (PyPI `lm_eval`) runs from its own venv (.venv-eval, built by the Makefile: torch==2.13.0 from
the machine's CPU wheel first, then lm_eval and transformers), as a subprocess, with its command line as a user
would type it:

  lm_eval --model local-completions --model_args model=demo-model,base_url=http://127.0.0.1:PORT/v1/completions,\\
          tokenizer=wizard/data/demo-model,tokenized_requests=False \\
          --include_path benchmarks/lm_eval_task --tasks k3_demo_mc --output_path DIR --log_samples

A loglikelihood task needs a tokenizer on lm-eval's side (to find where the context's ids end in the echoed
prompt). Two are run (CLIENTS). `local`, twice, one prompt a request: lm-eval loads the checkpoint's tiktoken.model
through transformers (`tokenizer=`) and sends text (`tokenized_requests=False`); transformers builds that tokenizer
with its own pre-tokenizer pattern, not MODEL.md §7's, so first every string lm-eval will encode is checked to give
the ids k3's own tokenizer gives (a difference stops the check before any server starts). `remote`, once, with
`--batch_size 4`: lm-eval asks the server's /tokenizer_info and /tokenize (`tokenizer_backend=remote`, no tokenizer
of its own) and sends the ids, four prompts a request.

The two budgets (the same engine flags `k3 run` takes): `resident` is the default plan (the whole trunk in RAM,
every expert in the cache); `streamed` serves from a packed trunk with no layer pinned (each layer read through a
ring of 2 slots every pass) and the expert cache at its floor (2 slots). Each server's memory plan is printed.
Per run: acc, acc_norm and every choice's loglikelihood and is_greedy as lm-eval logged them (its own decimal
text); every run must agree with the first to the last digit, else exit 1.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from k3core import load_tokenizer  # noqa: E402
sys.path.insert(0, str(ROOT / "benchmarks"))
from live_server import MODEL, LiveServer  # noqa: E402

HERE = Path(__file__).resolve().parent
TASK = "k3_demo_mc"
DATA = HERE / "k3_demo_mc.jsonl"

HF_IDS = """
import json, sys, transformers
tok = transformers.AutoTokenizer.from_pretrained(sys.argv[1])
print(json.dumps([tok(s, add_special_tokens=False).input_ids for s in json.load(sys.stdin)]))
"""


def check_tokenizer(eval_python: str, env: dict) -> int:
    """lm-eval encodes each context and each context + " " + choice (lm-eval's target_delimiter); the ids
    transformers gives must be the ids k3 gives, or the context/continuation split lands on the wrong id."""
    strings = []
    for line in DATA.read_text().splitlines():
        doc = json.loads(line)
        strings.append(doc["context"])
        strings += [doc["context"] + " " + choice for choice in doc["choices"]]
    out = subprocess.run([eval_python, "-c", HF_IDS, str(MODEL)], input=json.dumps(strings), env=env,
                         capture_output=True, text=True, check=True)
    theirs = json.loads(out.stdout)
    k3 = load_tokenizer(MODEL)
    bad = [(s, k3.encode(s), ids) for s, ids in zip(strings, theirs) if k3.encode(s) != ids]
    for s, ours, ids in bad:
        print(f"tokenizer mismatch on {s!r}: k3 {ours}, transformers {ids}")
    if bad:
        sys.exit(f"eval-check: {len(bad)} of {len(strings)} strings tokenize differently; the scores would be wrong")
    return len(strings)


CLIENTS = {  # how lm-eval tokenizes and batches: (its --model_args after model and base_url, its other flags)
    "local": (f"tokenizer={MODEL.relative_to(ROOT)},tokenized_requests=False", []),
    "remote": ("tokenizer_backend=remote", ["--batch_size", "4"]),
}


def lm_eval_run(lm_eval: str, url: str, client: str, out: Path, env: dict) -> dict:
    model_args, flags = CLIENTS[client]
    cmd = [lm_eval, "--model", "local-completions", "--model_args",
           f"model={MODEL.name},base_url={url}/v1/completions,{model_args}", *flags,
           "--include_path", str(HERE.relative_to(ROOT)), "--tasks", TASK, "--output_path", str(out), "--log_samples"]
    print("  $ " + " ".join(cmd), flush=True)
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"eval-check: lm_eval exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    results = json.loads(max(out.rglob("results_*.json")).read_text())["results"][TASK]
    samples = [json.loads(line) for line in max(out.rglob(f"samples_{TASK}_*.jsonl")).read_text().splitlines()]
    scores = [[doc["doc"]["id"], doc["filtered_resps"]] for doc in sorted(samples, key=lambda d: d["doc_id"])]
    return {"acc": results["acc,none"], "acc_norm": results["acc_norm,none"], "docs": len(samples),
            "scores": scores, "digest": hashlib.sha256(json.dumps(scores).encode()).hexdigest()[:16]}


BUDGETS = {
    "resident": [],
    "streamed": ["--trunk", "{trunk}", "--pin-layers", "0", "--ring", "2", "--cache-gb", "0"],
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eval-venv", default=str(ROOT / ".venv-eval"), help="the venv lm_eval is installed in")
    ap.add_argument("--k3", default=str(ROOT / ".venv" / "bin" / "k3"))
    ap.add_argument("--work", default=str(ROOT / "build" / "lm-eval"), help="packed trunk, logs, lm-eval outputs")
    ap.add_argument("--runs", type=int, default=2, help="lm_eval runs per budget with the local tokenizer (the "
                    "remote one runs once)")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HOME": str(work / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    n = check_tokenizer(str(Path(args.eval_venv) / "bin" / "python"), env)
    print(f"tokenizer: transformers gives k3's ids for all {n} strings lm-eval encodes")
    trunk = work / "trunk"
    subprocess.run([args.k3, "pack", str(MODEL), str(trunk), "--quiet"], check=True)

    runs = []
    for budget, flags in BUDGETS.items():
        flags = [f.format(trunk=trunk) for f in flags]
        log = work / f"serve-{budget}.log"
        server = LiveServer(flags, log, "eval-check", k3=args.k3)
        url = server.url
        try:
            plan = server.plan()
            print(f"\n{budget}: k3 serve {MODEL.relative_to(ROOT)} {' '.join(flags)}\n{plan}", flush=True)
            for client in CLIENTS:
                for i in range(1, (args.runs if client == "local" else 1) + 1):
                    out = work / f"{budget}-{client}-{i}"
                    subprocess.run(["rm", "-rf", str(out)], check=True)
                    r = lm_eval_run(str(Path(args.eval_venv) / "bin" / "lm_eval"), url, client, out, env)
                    print(f"  {budget} {client} run {i}: acc {r['acc']} acc_norm {r['acc_norm']} over {r['docs']} "
                          f"questions; per-choice loglikelihoods sha256 {r['digest']}", flush=True)
                    runs.append((f"{budget} {client}", i, r))
        finally:
            server.stop()

    first = runs[0][2]
    print("\nper-question scores (loglikelihood, is_greedy) of the first run:")
    for doc_id, resps in first["scores"]:
        print(f"  {doc_id:10} " + "  ".join(f"{float(lp):9.4f}{'*' if greedy == 'True' else ' '}"
                                            for lp, greedy in resps))
    differ = [(b, i) for b, i, r in runs if (r["acc"], r["acc_norm"], r["scores"]) !=
              (first["acc"], first["acc_norm"], first["scores"])]
    if differ:
        print(f"eval-check: FAILED: {differ} differ from {runs[0][0]} run 1")
        return 1
    print(f"eval-check: all {len(runs)} runs agree: acc {first['acc']}, acc_norm {first['acc_norm']}, "
          f"every loglikelihood the same digits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
