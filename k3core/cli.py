"""The `k3` command line: argument parsing, human and JSON output, exit codes.

Exit codes: 0 success; 1 runtime failure; 2 bad usage, config, checkpoint or input;
4 finished but the ids are unsound (an expert read failed). Errors go to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from . import __version__
from .errors import K3Error, UsageError

EXIT_CODES = """exit codes:
  0  success
  1  runtime failure (a bug, or the machine ran out of something)
  2  bad usage, config, checkpoint or input (the message names the field, file or tensor)
  4  the run finished but its ids are unsound (an expert read failed); do not trust them"""


def _parse_ids(text: str, source: str) -> list[int]:
    parts = [p for p in text.replace(",", " ").split() if p]
    try:
        return [int(p) for p in parts]
    except ValueError:
        bad = next(p for p in parts if not p.lstrip("-").isdigit())
        raise UsageError(f"{source}: {bad!r} is not a token id (ids are integers, comma- or space-separated)") from None


def _prompt_ids(args) -> list[int]:
    if args.ids is None and args.ids_file is None:
        raise UsageError("no prompt: give --ids 1,2,3 or --ids-file PATH")
    if args.ids is not None and args.ids_file is not None:
        raise UsageError("two prompt sources: give either --ids or --ids-file, not both")
    if args.ids is not None:
        ids = _parse_ids(args.ids, "--ids")
    else:
        try:
            ids = _parse_ids(Path(args.ids_file).read_text(), args.ids_file)
        except OSError as exc:
            raise UsageError(f"--ids-file {args.ids_file}: {exc.strerror}") from None
    if not ids:
        raise UsageError("the prompt is empty: give at least one token id")
    return ids


def _write_atomic(path: str, data: bytes) -> None:
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)


def _budget_options(args) -> dict:
    from .budget import resolve_budget

    budget = resolve_budget(args.preset, args.trunk_gb, args.cache_gb)
    options = {"cache_gb": budget.cache_gb, "ring_slots": args.ring}
    if args.trunk:
        options["trunk_dir"] = args.trunk
        options["trunk_gb"] = budget.trunk_gb
        if args.pin_layers is not None:
            options["pinned_layers"] = args.pin_layers
    elif args.pin_layers is not None:
        raise UsageError("--pin-layers pins layers of a packed trunk: give --trunk DIR (made by `k3 pack`)")
    elif args.trunk_gb is not None:
        raise UsageError("--trunk-gb limits a packed trunk: give --trunk DIR (made by `k3 pack`), or leave "
                         "--trunk-gb out to hold the whole trunk in RAM")
    return options


class _TraceRecorder:
    """(layer, expert) of every routing decision, written as int32 pairs (the k3-in-c format)."""

    def __init__(self):
        self.pairs = []

    def __call__(self, layer, ids):
        self.pairs.extend((layer, int(e)) for e in ids.reshape(-1))

    def write(self, directory, engine):
        import numpy as np

        from .checkpoint import EXPERT_PARTS, expert_prefix

        c = engine.config
        first_moe = min(c.first_k_dense_replace, c.num_hidden_layers - 1)
        expert_bytes = sum(engine.checkpoint.index[expert_prefix(first_moe, 0) + p].nbytes for p in EXPERT_PARTS)
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        _write_atomic(out / "expert_trace.bin", np.asarray(self.pairs, "<i4").reshape(-1, 2).tobytes())
        meta = {"tokens": engine.tokens_forwarded, "expert_bytes": expert_bytes, "requests": len(self.pairs),
                "model": str(engine.checkpoint.root), "top_k": c.num_experts_per_token}
        _write_atomic(out / "trace.json", (json.dumps(meta, indent=1) + "\n").encode())


def cmd_run(args) -> int:
    from .engine import Engine
    from .report import report_text, run_report

    if args.gen < 1:
        raise UsageError(f"--gen must be at least 1, got {args.gen}")
    ids = _prompt_ids(args)
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be at least 1, got {args.threads}")
    if args.ring < 2:
        raise UsageError(f"--ring must be at least 2 slots (a one-slot asynchronous ring overwrites the layer "
                         f"being computed), got {args.ring}")
    for flag, path in (("--json", args.json), ("--dump-logits", args.dump_logits)):
        if path and not Path(path).resolve().parent.is_dir():
            raise UsageError(f"{flag} {path}: its directory does not exist")
    options = _budget_options(args)
    start = time.perf_counter()
    with Engine(args.model, kernels=args.kernels, threads=args.threads, expert_store=args.expert_store,
                trunk_placer=args.trunk_placer, options=options, max_context=args.max_context,
                on_plan=lambda plan: print(plan.text(), file=sys.stderr)) as engine:
        engine.check_ids(ids)
        trace = _TraceRecorder() if args.dump_trace else None
        engine.on_route = trace
        load_seconds = time.perf_counter() - start
        stamps = []
        started = time.perf_counter()

        def on_token(token):
            stamps.append(time.perf_counter())
            if not args.quiet:
                print(token, end=" ", flush=True)

        generated, logits = engine.generate(ids, args.gen, full_recompute=args.full_recompute, on_token=on_token)
        if not args.quiet:
            print()
        mode = "full-recompute" if args.full_recompute else "incremental"
        report = run_report(engine, ids, generated, stamps, started, load_seconds, mode)
        report["threads"] = args.threads
        if trace is not None:
            trace.write(args.dump_trace, engine)
    print(report_text(report), file=sys.stderr if args.quiet else sys.stdout)
    if args.dump_logits:
        _write_atomic(args.dump_logits, logits.astype("<f4").tobytes())
    if args.json:
        _write_atomic(args.json, (json.dumps(report, indent=1) + "\n").encode())
    return 0


def cmd_presets(args) -> int:
    from .budget import PRESETS, WORKING_BYTES, auto_preset, mem_available

    available = mem_available()
    try:
        auto = auto_preset(available)
    except K3Error:
        auto = None
    rows = [{"name": n, "trunk_gb": t, "cache_gb": c, "auto": n == auto} for n, (t, c) in PRESETS.items()]
    if args.json:
        print(json.dumps({"available_bytes": available, "auto": auto, "presets": rows}, indent=1))
        return 0
    print(f"MemAvailable {available / 1e9:.1f} GB; auto picks {auto or 'nothing (not even laptop fits)'}\n")
    print(f"  {'preset':<12} {'trunk GB':>9} {'cache GB':>9}  needs about")
    for r in rows:
        need = (r["trunk_gb"] + r["cache_gb"]) + WORKING_BYTES / 1e9
        print(f"  {r['name']:<12} {r['trunk_gb']:>9.0f} {r['cache_gb']:>9.0f}  {need:.1f} GB + decode state"
              + ("   <- auto" if r["auto"] else ""))
    print("\nTrunk GB limits a packed trunk (k3 pack; --trunk DIR); without one the whole trunk is resident.")
    return 0


def cmd_make_model(args) -> int:
    from .testmodel import make_model, planned_bytes, shape_config

    size = planned_bytes(shape_config(args.shape))
    print(f"{args.dir}: {args.shape} test model, seed {args.seed}, {args.layout} config, {size / 1e6:,.1f} MB")

    def progress(done, total, fname):
        if not args.quiet and sys.stdout.isatty():
            print(f"\r  wrote shard {done}/{total} {fname}", end="\n" if done == total else "", flush=True)

    make_model(args.dir, args.shape, args.seed, args.layout, if_missing=args.if_missing, force=args.force,
               progress=progress)
    print(f"{args.dir}: ready")
    return 0


def cmd_plugins(args) -> int:
    from .plugin_manager import describe_plugins, get_plugin_manager

    rows = describe_plugins(get_plugin_manager())
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for row in rows:
        print(f"{row['name']} {row['version']} ({row['source']})")
        for hook in row["hooks"]:
            print(f"  {hook}: {', '.join(row['provides'][hook]) or '-'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(
        prog="k3", formatter_class=fmt,
        description="Run Kimi K3 on one CPU machine, exactly: the same ids at every memory budget.",
        epilog="examples:\n"
               "  k3 make-model demo-model --shape tiny        # a small checkpoint in the real format\n"
               "  k3 run demo-model --ids 1,2,3 --gen 8        # greedy ids + a run report\n"
               "  k3 plugins                                   # what is installed, hook by hook\n\n"
               + EXIT_CODES)
    p.add_argument("--version", action="version", version=f"k3 {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser(
        "run", formatter_class=fmt, help="generate token ids greedily from a prompt of ids",
        description="Load MODEL_DIR, consume the prompt and generate --gen ids greedily (argmax; ties\n"
                    "take the lowest id). Ids stream to stdout, then a run report.",
        epilog="examples:\n"
               "  k3 run demo-model --ids 1,2,3 --gen 8\n"
               "  k3 run demo-model --ids-file prompt.txt --gen 20 --json run.json\n"
               "  k3 run demo-model --ids 5,6 --gen 4 --full-recompute   # recompute the whole sequence each step\n"
               "  k3 run demo-model --ids 1,2 --kernels scalar --threads 1 --dump-logits a.f32\n"
               "  k3 run demo-model --ids 1,2 --threads 2 --dump-logits b.f32 && cmp a.f32 b.f32\n\n"
               + EXIT_CODES)
    run.add_argument("model", metavar="MODEL_DIR", help="checkpoint directory (config.json + safetensors shards)")
    run.add_argument("--ids", help="prompt token ids, e.g. 1,2,3")
    run.add_argument("--ids-file", metavar="PATH", help="read prompt ids from a file (comma/space separated)")
    run.add_argument("--gen", type=int, default=16, metavar="N", help="ids to generate (default 16)")
    run.add_argument("--full-recompute", action="store_true",
                     help="recompute the full sequence for every id instead of carrying decode state")
    run.add_argument("--json", metavar="OUT", help="also write the report as JSON to OUT (written only on success)")
    run.add_argument("--kernels", metavar="NAME",
                     help="kernel backend: avx512, avx2, neon, scalar or reference (default: K3_KERNELS, else the "
                          "best this CPU runs); every backend gives the same bits")
    run.add_argument("--threads", type=int, metavar="N",
                     help="kernel threads (default: the CPUs this process may use); never changes a bit")
    run.add_argument("--dump-logits", metavar="PATH",
                     help="write the float32 logits of every generated step to PATH (raw little-endian, one "
                          "step after another), to compare configurations byte for byte")
    run.add_argument("--expert-store", metavar="NAME", help="expert store plugin (see `k3 plugins`)")
    run.add_argument("--trunk-placer", metavar="NAME", help="trunk placer plugin (see `k3 plugins`)")
    run.add_argument("--trunk", metavar="DIR", help="a packed trunk (`k3 pack`): stream what does not fit "
                     "--trunk-gb through a ring of slots instead of holding the whole trunk in RAM")
    run.add_argument("--preset", choices=["laptop", "desktop", "workstation", "server", "max", "auto"],
                     help="trunk and expert-cache budgets in one word (see `k3 presets`); auto from MemAvailable")
    run.add_argument("--trunk-gb", type=float, metavar="GB", help="RAM for the packed trunk: pinned layers + ring")
    run.add_argument("--cache-gb", type=float, metavar="GB", help="RAM for the expert cache (default 1)")
    run.add_argument("--pin-layers", type=int, metavar="N",
                     help="pin exactly the first N layers of the packed trunk instead of as many as --trunk-gb holds")
    run.add_argument("--ring", type=int, default=2, metavar="N",
                     help="slots of the streaming ring (default 2; the next layer is read while one computes)")
    run.add_argument("--max-context", type=int, default=4096, metavar="N",
                     help="positions the memory plan reserves MLA cache for (default 4096)")
    run.add_argument("--dump-trace", metavar="DIR",
                     help="record (layer, expert) of every routing decision into DIR/expert_trace.bin + trace.json "
                          "(replay with `k3 sim-cache DIR`)")
    run.add_argument("--quiet", action="store_true", help="print only the ids (report to stderr)")
    run.set_defaults(func=cmd_run)

    mm = sub.add_parser(
        "make-model", formatter_class=fmt, help="write a small checkpoint in the real K3 format",
        description="Write a test checkpoint in the real format: sharded safetensors with an index json,\n"
                    "BF16/F32 trunk, MXFP4 experts, config.json, tiktoken.model and tokenizer_config.json.\n"
                    "The same shape and seed always give the same bytes. The size is printed before writing.\n\n"
                    "shapes: tiny  = SPEC §9's 13-layer oracle shape (~1 MB)\n"
                    "        small = a second shape where every count differs (~3 MB)\n"
                    "        medium = 25 layers, 16 of 64 experts: for streaming tests (~52 MB)\n"
                    "        wide  = real K3 widths, 4 layers, 32 experts (~6.6 GB, for benchmarks)",
        epilog="examples:\n  k3 make-model demo-model --shape tiny --seed 0\n"
               "  k3 make-model /data/k3-wide --shape wide --layout flat")
    mm.add_argument("dir", metavar="DIR")
    mm.add_argument("--shape", default="tiny", choices=["tiny", "small", "medium", "wide"])
    mm.add_argument("--seed", type=int, default=0)
    mm.add_argument("--layout", default="nested", choices=["nested", "flat"],
                    help="nested = the released config.json layout (default); flat = all fields at the root")
    mm.add_argument("--if-missing", action="store_true", help="do nothing if DIR already holds this exact model")
    mm.add_argument("--force", action="store_true", help="replace whatever DIR holds")
    mm.add_argument("--quiet", action="store_true")
    mm.set_defaults(func=cmd_make_model)

    pr = sub.add_parser("presets", help="memory presets and which one auto picks here",
                        description="The trunk / expert-cache budgets each preset gives, and which one --preset auto\n"
                                    "picks from this machine's MemAvailable.", formatter_class=fmt)
    pr.add_argument("--json", action="store_true", help="machine-readable output")
    pr.set_defaults(func=cmd_presets)

    pl = sub.add_parser("plugins", help="list installed plugins, their versions and hooks",
                        description="Every plugin (built-in or from the 'k3' entry-point group) with its version,\n"
                                    "the hooks it implements and what each provides.", formatter_class=fmt)
    pl.add_argument("--json", action="store_true", help="machine-readable output")
    pl.set_defaults(func=cmd_plugins)
    from .bench import add_parser as add_bench
    from .cachesim import add_parser as add_sim_cache
    from .doctor import add_parser as add_doctor
    from .pack import add_parser as add_pack
    add_pack(sub)
    add_doctor(sub)
    add_bench(sub)
    add_sim_cache(sub)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except K3Error as exc:
        print(f"k3: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("k3: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`k3 run … | head -1`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as exc:  # a runtime failure: short message; K3_DEBUG=1 for the traceback
        if os.environ.get("K3_DEBUG"):
            raise
        print(f"k3: runtime failure: {type(exc).__name__}: {exc} (set K3_DEBUG=1 for a traceback)", file=sys.stderr)
        return 1
