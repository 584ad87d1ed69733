"""The `k3` command line: argument parsing, human and JSON output, exit codes.

Exit codes: 0 success; 1 runtime failure; 2 bad usage, config, checkpoint or input;
4 finished but the ids are unsound (an expert read failed). Errors go to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
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


def peak_rss_bytes() -> int:
    """Peak resident set size of this process, from the OS (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


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


def cmd_run(args) -> int:
    from .engine import Engine

    if args.gen < 1:
        raise UsageError(f"--gen must be at least 1, got {args.gen}")
    ids = _prompt_ids(args)
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be at least 1, got {args.threads}")
    for flag, path in (("--json", args.json), ("--dump-logits", args.dump_logits)):
        if path and not Path(path).resolve().parent.is_dir():
            raise UsageError(f"{flag} {path}: its directory does not exist")
    start = time.perf_counter()
    with Engine(args.model, kernels=args.kernels, threads=args.threads, expert_store=args.expert_store,
                trunk_placer=args.trunk_placer) as engine:
        engine.check_ids(ids)
        load_seconds = time.perf_counter() - start
        stamps = []
        t0 = time.perf_counter()

        def on_token(token):
            stamps.append(time.perf_counter())
            if not args.quiet:
                print(token, end=" ", flush=True)

        generated, logits = engine.generate(ids, args.gen, full_recompute=args.full_recompute, on_token=on_token)
        if not args.quiet:
            print()
        first = stamps[0] - t0
        decode = [b - a for a, b in zip(stamps, stamps[1:])]
        report = {
            "model": str(args.model),
            "prompt_ids": ids,
            "generated_ids": generated,
            "mode": "full-recompute" if args.full_recompute else "incremental",
            "load_seconds": load_seconds,
            "prefill_seconds": first,
            "seconds_per_token": sum(decode) / len(decode) if decode else first,
            "peak_rss_bytes": peak_rss_bytes(),
            "kernels": engine.kernels.name,
            "threads": args.threads,
            "expert_store": engine.store.name,
            "trunk_placer": engine.placer.name,
            "stats": engine.stats(),
        }
    print(_report_text(report), file=sys.stderr if args.quiet else sys.stdout)
    if args.dump_logits:
        _write_atomic(args.dump_logits, logits.astype("<f4").tobytes())
    if args.json:
        _write_atomic(args.json, (json.dumps(report, indent=1) + "\n").encode())
    return 0


def _report_text(r: dict) -> str:
    s = r["stats"]
    return (f"prompt {len(r['prompt_ids'])} ids, generated {len(r['generated_ids'])} ({r['mode']}); "
            f"load {r['load_seconds']:.2f} s, prefill {r['prefill_seconds']:.3f} s, "
            f"decode {r['seconds_per_token']:.3f} s/token; peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB\n"
            f"kernels {r['kernels']}, expert store {r['expert_store']}, trunk placer {r['trunk_placer']}; "
            f"expert requests {s.get('expert_requests', 0)}, expert bytes read "
            f"{s.get('expert_bytes_read', 0) / 2**20:.1f} MiB, trunk bytes read {s.get('trunk_bytes_read', 0) / 2**20:.1f} MiB")


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
    run.add_argument("--quiet", action="store_true", help="print only the ids (report to stderr)")
    run.set_defaults(func=cmd_run)

    mm = sub.add_parser(
        "make-model", formatter_class=fmt, help="write a small checkpoint in the real K3 format",
        description="Write a test checkpoint in the real format: sharded safetensors with an index json,\n"
                    "BF16/F32 trunk, MXFP4 experts, config.json, tiktoken.model and tokenizer_config.json.\n"
                    "The same shape and seed always give the same bytes. The size is printed before writing.\n\n"
                    "shapes: tiny  = SPEC §9's 13-layer oracle shape (~1 MB)\n"
                    "        small = a second shape where every count differs (~2 MB)\n"
                    "        wide  = real K3 widths, 4 layers, 32 experts (~6.6 GB, for benchmarks)",
        epilog="examples:\n  k3 make-model demo-model --shape tiny --seed 0\n"
               "  k3 make-model /data/k3-wide --shape wide --layout flat")
    mm.add_argument("dir", metavar="DIR")
    mm.add_argument("--shape", default="tiny", choices=["tiny", "small", "wide"])
    mm.add_argument("--seed", type=int, default=0)
    mm.add_argument("--layout", default="nested", choices=["nested", "flat"],
                    help="nested = the released config.json layout (default); flat = all fields at the root")
    mm.add_argument("--if-missing", action="store_true", help="do nothing if DIR already holds this exact model")
    mm.add_argument("--force", action="store_true", help="replace whatever DIR holds")
    mm.add_argument("--quiet", action="store_true")
    mm.set_defaults(func=cmd_make_model)

    pl = sub.add_parser("plugins", help="list installed plugins, their versions and hooks",
                        description="Every plugin (built-in or from the 'k3' entry-point group) with its version,\n"
                                    "the hooks it implements and what each provides.", formatter_class=fmt)
    pl.add_argument("--json", action="store_true", help="machine-readable output")
    pl.set_defaults(func=cmd_plugins)
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
