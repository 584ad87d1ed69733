"""`k3 bench decode`: what several positions per pass buy — serial decoding against speculative decoding
(replayed oracle drafts at K = 1, 2, 4, 8; always-wrong drafts at K = 4 and auto; ngram lookup on a few
prompts) and against batches of 1, 2, 4 and 8 sequences. Every run is its own process under the same memory
cgroup limit as `k3 bench stream` (budget + --overhead-gb); each row prints s/token, tokens/s, bytes read
per generated token, forward passes, ratios against the serial run of the same invocation, and whether its
ids are the serial ones. With --c-engine, prefill of --prefill-ids ids (trunk resident, experts cached) is
timed for k3 and for the C engine `kimi-k3-in-c` in the same invocation.

Not a test: it measures and prints; it asserts nothing about speed.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .stream import default_budgets, run_limited

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
NGRAM_PROMPTS = {  # ids that repeat, as "repeat after me" or a list does
    "repeated phrase": [11, 12, 13, 14, 15, 11, 12, 13, 14, 15, 11, 12],
    "list": [40, 7, 41, 7, 42, 7, 43, 7, 44, 7, 45, 7],
}


def batch_prompts(n: int) -> list[list[int]]:
    """n different prompts of different lengths (8..11 ids)."""
    return [[(p * 7 + i * 13 + 1) % 997 for i in range(8 + p % 4)] for p in range(n)]


# ---- the worker: one configuration, in its own process ----------------------------------------------------

def worker(job: dict) -> dict:
    """Open the engine `job` describes and generate; the ids, timings and counters as a dict."""
    from ...api import BatchGenerator, EngineConfig, Sampler, SamplingParams, Session, open_engine, speculation
    from ...report.run import peak_rss_bytes
    from ...generation.session import bytes_read

    fields = dict(trunk=job.get("trunk"), trunk_gb=job.get("trunk_gb"), cache_gb=job.get("cache_gb"),
                  pin_layers=job.get("pin_layers"), max_context=512 + 64,
                  speculate=job.get("reserve", 0), sequences=len(job["prompts"]))
    started = time.perf_counter()
    with open_engine(EngineConfig(job["model"], **{k: v for k, v in fields.items() if v is not None})) as engine:
        load = time.perf_counter() - started
        used = {"kernels": engine.kernels.name, "expert_store": engine.store.name, "trunk_placer": engine.placer.name}
        gen, prompts = job["gen"], job["prompts"]
        if len(prompts) == 1:
            spec = speculation(job["draft"], job["speculate"]) if job.get("speculate") else None
            *_, done = Session(engine).generate(prompts[0], SamplingParams(max_tokens=gen), speculation=spec)
            s = done.stats
            return {"ids": [done.ids], "load_seconds": load, "prefill_seconds": s["prefill_seconds"],
                    "decode_seconds": s["stamps"][-1] - s["stamps"][0], "decode_tokens": len(done.ids) - 1,
                    "forward_passes": s["forward_passes"], "decode_passes": s["decode_passes"],
                    "draft_proposed": s["draft_proposed"], "draft_accepted": s["draft_accepted"],
                    "bytes_read_per_token": s["bytes_read_per_token"], "peak_rss_bytes": peak_rss_bytes(), **used}
        batch = BatchGenerator(engine)
        handles = [batch.add(p, engine.new_state(), Sampler()) for p in prompts]
        ids = {h: [] for h in handles}
        t0, passes0 = time.perf_counter(), engine.forward_passes
        first = None
        while len(batch):
            for e in batch.step():
                ids[e.handle].append(e.token)
                if len(ids[e.handle]) == gen:
                    batch.remove(e.handle)
            if first is None and all(ids.values()):
                first = (time.perf_counter(), bytes_read(engine), engine.forward_passes)
        end = time.perf_counter()
        tokens = sum(len(v) - 1 for v in ids.values())
        return {"ids": [ids[h] for h in handles], "load_seconds": load, "prefill_seconds": first[0] - t0,
                "decode_seconds": end - first[0], "decode_tokens": tokens,
                "forward_passes": engine.forward_passes - passes0, "decode_passes": engine.forward_passes - first[2],
                "draft_proposed": 0, "draft_accepted": 0,
                "bytes_read_per_token": (bytes_read(engine) - first[1]) / tokens if tokens else None,
                "peak_rss_bytes": peak_rss_bytes(), **used}


def prefill_worker(job: dict) -> dict:
    """k3's prefill of job["prefill"] ids with the trunk resident and every expert cached: seconds."""
    from ...api import EngineConfig, open_engine

    with open_engine(EngineConfig(job["model"], cache_gb=job["cache_gb"], max_context=len(job["prefill"]) + 8,
                                  prefill_chunk=len(job["prefill"]))) as engine:
        engine.forward(job["prefill"][:8], engine.new_state())  # warm: every expert this prompt needs, mostly
        state, t0 = engine.new_state(), time.perf_counter()
        logits = engine.forward(job["prefill"], state)
        return {"prefill_seconds": time.perf_counter() - t0, "first_id": int(logits.argmax())}


def references_worker(job: dict) -> dict:
    """Serial greedy ids of each of job["prompts"], trunk resident and experts cached (ids do not depend on
    the budget): what each sequence of a batch must produce."""
    from ...api import EngineConfig, greedy_ids, open_engine

    with open_engine(EngineConfig(job["model"], cache_gb=job["cache_gb"], max_context=512)) as engine:
        return {"ids": [greedy_ids(engine, p, job["gen"])[0] for p in job["prompts"]]}


WORKERS = {"decode": worker, "prefill": prefill_worker, "references": references_worker}


def run_job(job: dict, limit: int | None) -> dict:
    """`job` in a fresh process (this module as a script), under a cgroup of `limit` bytes where possible."""
    with tempfile.TemporaryDirectory() as tmp:
        spec, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
        spec.write_text(json.dumps(job))
        ran = run_limited([sys.executable, "-m", "k3core.cli.bench.decode", str(spec), str(out)], limit)
        if ran["exit"] != 0:
            return {"error": ran["stderr"][-2000:], "exit": ran["exit"]}
        result = json.loads(out.read_text())
    return {**result, "process_wall_seconds": ran["wall"], "peak_cgroup_bytes": ran["peak"],
            "limit_kind": ran["limit_kind"]}


# ---- the C engine's prefill, for comparison --------------------------------------------------------------

def c_engine_prefill(binary: str, model: str, ids: list[int], cache_gb: float) -> dict:
    """The C engine's prompt pass on the same ids (trunk resident, experts cached): its own reported
    prefill time when it gives one, else the wall time of a 1-token run minus a 1-id run."""
    def run(prompt):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "c.json"
            t0 = time.perf_counter()
            proc = subprocess.run([binary, model, "--ids", ",".join(map(str, prompt)), "--gen", "1", "--incremental",
                                   "--cache-gb", str(cache_gb), "--out", str(out)], capture_output=True)
            wall = time.perf_counter() - t0
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr.decode(errors="replace")[-800:])
            report = json.loads(out.read_text()) if out.exists() else {}
        return wall, report

    full_wall, report = run(ids)
    one_wall, _ = run(ids[:1])
    tokens = report.get("tokens") or report.get("generated_ids") or report.get("output_ids")
    return {"prefill_seconds": full_wall - one_wall, "method": "wall(prompt) - wall(1 id)",
            "first_id": tokens[0] if isinstance(tokens, list) and tokens else None}


# ---- the table ---------------------------------------------------------------------------------------------

def plan_runs(args, vocab: int) -> list[tuple[str, dict]]:
    base = dict(model=str(args.model), trunk=str(args.trunk), trunk_gb=args.trunk_gb, cache_gb=args.cache_gb,
                pin_layers=0 if args.floor else None, gen=args.gen, prompts=[PROMPT])
    runs = [("serial", base)]
    for k in (1, 2, 4, 8):
        runs.append((f"replay oracle K={k}", {**base, "speculate": k, "reserve": k, "draft": "replay:ORACLE"}))
    runs.append(("replay wrong K=4", {**base, "speculate": 4, "reserve": 4, "draft": "replay:WRONG"}))
    runs.append(("replay wrong auto", {**base, "speculate": "auto", "reserve": 8, "draft": "replay:WRONG"}))
    for name, prompt in NGRAM_PROMPTS.items():
        runs.append((f"serial, {name}", {**base, "prompts": [prompt]}))
        runs.append((f"ngram auto, {name}", {**base, "prompts": [prompt], "speculate": "auto", "reserve": 8,
                                             "draft": "ngram"}))
    for n in (1, 2, 4, 8):
        runs.append((f"batch of {n}", {**base, "prompts": batch_prompts(n)}))
    return runs


def cmd_decode(args) -> int:
    from ...io.pack import pack
    from ...format.checkpoint import open_checkpoint

    model, trunk = Path(args.model), Path(args.trunk)
    if not (trunk / "manifest.json").exists():
        print(f"packing {model} into {trunk} first …", file=sys.stderr)
        pack(model, trunk)
    args.floor = args.trunk_gb is None  # the ring alone, nothing pinned
    if args.trunk_gb is None or args.cache_gb is None:  # the floor: the ring alone, the cache floor
        floor_trunk, floor_cache = default_budgets(model, [trunk])[0]
        args.trunk_gb = floor_trunk if args.trunk_gb is None else args.trunk_gb
        args.cache_gb = floor_cache if args.cache_gb is None else args.cache_gb
    ckpt = open_checkpoint(model)
    vocab = ckpt.config.vocab_size
    ckpt.close()
    limit = int((args.trunk_gb + args.cache_gb + args.overhead_gb) * 1e9)
    rows, serial = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, job in plan_runs(args, vocab):
            draft = job.get("draft", "")
            if draft.startswith("replay:"):
                ids = serial["serial"]["ids"][0]
                ids = ids if draft == "replay:ORACLE" else [(t + 1) % vocab for t in ids]
                path = Path(tmp) / f"{draft[7:].lower()}.txt"
                path.write_text(" ".join(map(str, ids)))
                job = {**job, "draft": f"replay:{path}"}
            print(f"  {name} …", file=sys.stderr, flush=True)
            r = run_job(job, limit)
            r["name"], r["sequences"] = name, len(job["prompts"])
            if name.startswith("serial"):
                serial[name] = r
            rows.append(r)
        print("  each batch prompt alone (trunk resident, experts cached) …", file=sys.stderr, flush=True)
        refs = run_job({"kind": "references", "model": str(model), "cache_gb": args.prefill_cache_gb,
                        "prompts": batch_prompts(8), "gen": args.gen}, None)
        if args.c_engine:
            print("  prefill, k3 and the C engine …", file=sys.stderr, flush=True)
            prefill = [(i * 31 + 7) % vocab for i in range(args.prefill_ids)]
            cache = args.prefill_cache_gb
            ours = run_job({"model": str(model), "cache_gb": cache, "prefill": prefill, "kind": "prefill"}, None)
            theirs = c_engine_prefill(args.c_engine, str(model), prefill, cache)
    solo = {tuple(p): ids for p, ids in zip(batch_prompts(8), refs.get("ids", []))}
    for r in rows:
        if "error" not in r:
            ref = serial.get(f"serial, {r['name'].split(', ', 1)[1]}", serial["serial"]) if ", " in r["name"] \
                else serial["serial"]
            r.update(compared(r, ref, solo))
    doc = {"model": str(model), "trunk": str(trunk), "trunk_gb": args.trunk_gb, "cache_gb": args.cache_gb,
           "limit_bytes": limit, "gen": args.gen, "runs": rows}
    if args.c_engine:
        doc["prefill"] = {"ids": args.prefill_ids, "k3": ours, "c_engine": theirs}
    print(json.dumps(doc, indent=1) if args.json else decode_table(doc))
    return 0


def compared(r: dict, ref: dict, solo: dict) -> dict:
    """A run's decode figures and its ratios against `ref` (its serial run), and whether its ids are serial
    decoding's: a single sequence against its serial run, each sequence of a batch against its prompt alone."""
    spt = r["decode_seconds"] / r["decode_tokens"]
    ref_spt = ref["decode_seconds"] / ref["decode_tokens"]
    per, ref_per = r["bytes_read_per_token"], ref["bytes_read_per_token"]
    if r["name"].startswith("batch"):
        same = all(ids == solo.get(tuple(p)) for ids, p in zip(r["ids"], batch_prompts(r["sequences"])))
    else:
        same = r["ids"] == ref["ids"]
    return {"seconds_per_token": spt, "tokens_per_second": 1 / spt, "vs_serial_tokens_per_second": ref_spt / spt,
            "vs_serial_seconds_per_token": spt / ref_spt,
            "vs_serial_bytes_per_token": per / ref_per if per is not None and ref_per else None, "ids_identical": same}


def decode_table(doc: dict) -> str:
    """The document of one `k3 bench decode` as Markdown (what docs/PERFORMANCE.md shows)."""
    from ...units import human

    runs = doc["runs"]
    lines = [f"decode on {Path(doc['model']).name} at trunk {doc['trunk_gb']:.2f} GB + cache {doc['cache_gb']:.2f} GB, "
             f"limit {human(doc['limit_bytes'])} ({runs[0].get('limit_kind', '-')}); {doc['gen']} ids per sequence; "
             "ratios against the serial run of the same prompt in this invocation",
             "kernels {kernels}, expert store {expert_store}, trunk placer {trunk_placer}".format(
                 **{k: runs[0].get(k, "?") for k in ("kernels", "expert_store", "trunk_placer")}), "",
             "| run | s/token | tokens/s | × serial tokens/s | s/token ÷ serial | bytes read / token | ÷ serial "
             "| passes | drafts accepted | peak (cgroup) | ids identical |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in runs:
        if "error" in r:
            lines.append(f"| {r['name']} | failed (exit {r['exit']}): "
                         f"{r['error'].strip().splitlines()[-1] if r['error'].strip() else ''} | | | | | | | | | |")
            continue
        per = r["bytes_read_per_token"]
        drafts = f"{r['draft_accepted']} / {r['draft_proposed']}" if r["draft_proposed"] else "–"
        ratio = r["vs_serial_bytes_per_token"]
        lines.append(f"| {r['name']} | {r['seconds_per_token']:.3f} | {r['tokens_per_second']:.2f} | "
                     f"{r['vs_serial_tokens_per_second']:.2f} | {r['vs_serial_seconds_per_token']:.2f} | "
                     f"{human(per) if per is not None else 'n/a'} | {f'{ratio:.2f}' if ratio is not None else 'n/a'} | "
                     f"{r['forward_passes']} | {drafts} | {human(r['peak_cgroup_bytes'] or r['peak_rss_bytes'])} | "
                     f"{'yes' if r['ids_identical'] else 'NO'} |")
    if "prefill" in doc:
        p, n = doc["prefill"], doc["prefill"]["ids"]
        lines += ["", f"prefill of {n} ids, trunk resident, experts cached: k3 {p['k3']['prefill_seconds']:.2f} s "
                      f"({n / p['k3']['prefill_seconds']:.1f} ids/s), the C engine {p['c_engine']['prefill_seconds']:.2f} s "
                      f"({n / p['c_engine']['prefill_seconds']:.1f} ids/s; {p['c_engine']['method']}): "
                      f"{p['c_engine']['prefill_seconds'] / p['k3']['prefill_seconds']:.2f}x; first id "
                      f"{p['k3']['first_id']} vs {p['c_engine']['first_id']}"]
    return "\n".join(lines)


def add_parser(sub) -> None:
    from ..options import GB

    import argparse

    p = sub.add_parser(
        "decode", help="serial vs speculative decoding vs batched sequences: s/token, bytes per token, passes",
        formatter_class=argparse.RawDescriptionHelpFormatter, description=__doc__.split("\n\n")[0],
        epilog="examples:\n  k3 make-model /data/k3-wide --shape wide && k3 pack /data/k3-wide /data/k3-wide-trunk\n"
               "  k3 bench decode /data/k3-wide --trunk /data/k3-wide-trunk           # at the floor budget\n"
               "  k3 bench decode /data/k3-wide --trunk /data/k3-wide-trunk --trunk-gb 8 --cache-gb 3 --gen 16\n"
               "  k3 bench decode /data/k3-wide --trunk /data/k3-wide-trunk --c-engine ~/kimi-k3-in-c/bin/k3")
    p.add_argument("model", metavar="MODEL_DIR")
    p.add_argument("--trunk", required=True, metavar="DIR", help="packed trunk (made first if missing)")
    p.add_argument("--trunk-gb", type=GB, metavar="GB", help="trunk budget (default: the ring alone)")
    p.add_argument("--cache-gb", type=GB, metavar="GB", help="expert cache (default: the floor, 0)")
    p.add_argument("--gen", type=int, default=12, metavar="N", help="ids per sequence (default 12)")
    p.add_argument("--overhead-gb", type=GB, default=2.5,
                   help="memory allowed above the budgets (Python, numpy, activations, decode states; default 2.5)")
    p.add_argument("--c-engine", metavar="BINARY", help="also time the C engine's prefill (kimi-k3-in-c's bin/k3)")
    p.add_argument("--prefill-ids", type=int, default=512, metavar="N", help="prompt length of the prefill row "
                   "(default 512)")
    p.add_argument("--prefill-cache-gb", type=GB, default=8.0, metavar="GB",
                   help="expert cache of the prefill row (default 8: every expert of `wide`)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_decode)


CHAT_PROMPTS = {  # what people ask that repeats itself: where lookup drafts can be right
    "repeat after me": "Repeat after me: the quick brown fox jumps over the lazy dog.",
    "continue a list": "Continue the list: Monday, Tuesday, Wednesday, Thursday,",
    "quote the question": "What is the capital of France? Answer in a full sentence.",
    "say it twice": "Say hello twice.",
    "a sum": "What is 7 + 5?",
}


def cmd_drafts(args) -> int:
    """ngram acceptance on chat prompts, serial vs --speculate auto and 4, in this process; with --transcripts,
    teacher-forced acceptance on recorded conversations (bench_transcripts.py)."""
    from ...errors import UsageError
    from .transcripts import cmd_transcripts

    if args.transcripts:
        return cmd_transcripts(args)
    for flag, given in (("--sources", args.sources), ("--tokenizer", args.tokenizer), ("--jobs", args.jobs)):
        if given is not None:
            raise UsageError(f"{flag} needs --transcripts: the chat prompts are decoded by the model, with ngram "
                             "drafts and its own tokenizer")
    from ...api import ChatSession, EngineConfig, SamplingParams, load_tokenizer, open_engine, speculation
    from ...generation.generate import AUTO_K
    from ...format.notes import demo_model_dir

    model = Path(args.model) if args.model else demo_model_dir()
    rows = []
    with open_engine(EngineConfig(model, speculate=AUTO_K)) as engine:
        tok = load_tokenizer(model)
        for name, text in CHAT_PROMPTS.items():
            runs = {}
            for how, spec in (("serial", None), ("ngram K=4", ("ngram", 4)), ("ngram auto", ("ngram", "auto"))):
                chat = ChatSession(engine, tok)
                for _ in chat.ask(text, SamplingParams(max_tokens=args.gen),
                                  speculation=speculation(*spec) if spec else None):
                    pass
                runs[how] = chat.last
            for how, last in runs.items():
                rows.append({"prompt": name, "run": how, "answer": last["answer"],
                             "generated": last["generated_tokens"], "decode_passes": last["decode_passes"],
                             "drafted": last["draft_proposed"], "accepted": last["draft_accepted"],
                             "identical": last["answer"] == runs["serial"]["answer"]})
    if args.json:
        print(json.dumps({"model": str(model), "rows": rows}, indent=1))
        return 0
    print(f"ngram drafts on chat prompts, {model.name}, greedy, up to {args.gen} ids\n")
    print("| prompt | run | ids | decode passes | drafted | accepted | acceptance | same answer |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    answers = []
    for r in rows:
        share = f"{100 * r['accepted'] / r['drafted']:.0f} %" if r["drafted"] else "–"
        print(f"| {r['prompt']} | {r['run']} | {r['generated']} | {r['decode_passes']} | {r['drafted']} | "
              f"{r['accepted']} | {share} | {'yes' if r['identical'] else 'NO'} |")
        if r["run"] == "serial":
            answers.append(f"  {r['prompt']}: {CHAT_PROMPTS[r['prompt']]!r} -> {r['answer']!r}")
    print("\nthe serial answers:\n" + "\n".join(answers))
    return 0


def add_drafts_parser(sub) -> None:
    import argparse

    from .tokenizer import HELP as TOKENIZER_HELP

    p = sub.add_parser("drafts", help="draft acceptance: ngram on chat prompts, or any draft source on recorded "
                       "conversations (--transcripts); default model: the demo model",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Chat prompts whose replies repeat what was said (repeat after me, continuing a\n"
                                   "list, quoting the question), each answered serially, with --speculate 4 and with\n"
                                   "--speculate auto (ngram drafts): passes, drafts, acceptance, and whether the answer\n"
                                   "is the serial one. In this process; the model must fit in RAM.\n\n"
                                   "With --transcripts FILE.jsonl (one {\"messages\": [...], \"kind\": ...} per\n"
                                   "line, OpenAI roles including tool): every assistant turn teacher-forced,\n"
                                   "without running the model (only its tokenizer is read): tokens per pass and\n"
                                   "accepted / proposed ids of each --sources draft source at K = 1, 2, 4, 8 and\n"
                                   "auto, per kind and overall. benchmarks/transcripts/transcripts.jsonl is a set\n"
                                   "built from local text (its README says what and from where).\n\n"
                                   "The demo model's tokenizer has 768 ids (~1.4 characters each) and overstates\n"
                                   "acceptance; --tokenizer scores with a real-sized vocabulary\n"
                                   "(docs/performance-notes/draft-acceptance-transcripts.md). MODEL_DIR still gives\n"
                                   "the chat markup of a plain ranks file and the pass bytes that `auto` weighs\n"
                                   "drafts by.",
                       epilog="examples:\n  k3 bench drafts\n  k3 bench drafts /models/my-model --gen 80 --json\n"
                              "  k3 bench drafts --transcripts benchmarks/transcripts/transcripts.jsonl "
                              "--sources ngram\n"
                              "  k3 bench drafts /models/my-model --transcripts chats.jsonl --sources ngram,suffix "
                              "--json\n"
                              "  k3 bench drafts --transcripts benchmarks/transcripts/transcripts.jsonl "
                              "--tokenizer qwen --json > drafts.json\n"
                              "  k3 bench drafts --transcripts chats.jsonl --tokenizer /models/Kimi-K3   # K3's ids\n"
                              "  python -m k3core.cli.bench.transcripts drafts.json   # the table of a --json file")
    p.add_argument("model", metavar="MODEL_DIR", nargs="?", help="default: the shipped demo model")
    p.add_argument("--gen", type=int, default=60, metavar="N", help="ids per reply at most (default 60)")
    p.add_argument("--transcripts", metavar="FILE.jsonl", help="score recorded conversations instead (teacher-forced)")
    p.add_argument("--sources", metavar="NAME[,NAME]", help="with --transcripts: the draft sources, each "
                   "NAME[:ARGUMENT] (default ngram,suffix)")
    p.add_argument("--tokenizer", metavar="DIR|FILE|qwen", help="with --transcripts: " + TOKENIZER_HELP)
    p.add_argument("--jobs", type=int, metavar="N", help="with --transcripts: (source, K) runs at once, each in its "
                   "own process (default: the cores)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_drafts)


if __name__ == "__main__":  # the worker process of run_job
    job = json.loads(Path(sys.argv[1]).read_text())
    result = WORKERS[job.get("kind", "decode")](job)
    Path(sys.argv[2]).write_text(json.dumps(result))
