"""`k3 bench pair`: two packed trunks of one checkpoint in ONE process, at the same budgets, generating the
same prompt one token each in turn (who goes first swaps every round); or, with --unchecked, one pack twice,
the second engine reading without checking its weight bytes (what the checks cost). Two processes run at different
speeds on this kind of machine for reasons neither controls (which physical pages their buffers got, what
the disk's cache holds at the time); taking turns in one process gives both the same conditions, so their
ratio is about the packs. The ids must be the same (exit 4 if not: the packs disagree).

Not a test: it measures and prints; it asserts nothing about speed.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

MAX_GEN = 4096  # ids per engine: two engines each hold a decode state this long


UNCHECKED = {"check_reads": False}  # the placer's and the store's option: no checksum on any weight read


def _engine(model, trunk, args, checked: bool = True):
    from ...api import EngineConfig, open_engine

    context = max(16, len(args.ids) + args.gen)  # 16: the engine's least context
    fields = dict(trunk=trunk, trunk_gb=args.trunk_gb, cache_gb=args.cache_gb, max_context=context)
    if not checked:
        fields.update(store_options=UNCHECKED, placer_options=UNCHECKED)
    return open_engine(EngineConfig(model, **{k: v for k, v in fields.items() if v is not None}))


def _summary(name, trunk, engine, times, load) -> dict:
    from ...report.run import per_second

    s = engine.stats()
    steady = times[1:]  # the first is the prompt's prefill

    def rate(key):
        return per_second(s.get(f"{key}_bytes_read", 0), s.get(f"{key}_read_seconds", 0.0))

    checked = s.get("trunk_reads_checked", True) and s.get("expert_reads_checked", True)
    return {"name": name, "trunk": str(trunk) + ("" if checked else " (unchecked)"), "trunk_codec": s.get("trunk_codec"),
            "reads_checked": checked, "load_seconds": load,
            "prefill_seconds": times[0], "seconds_per_token": statistics.median(steady) if steady else None,
            "mean_seconds_per_token": statistics.fmean(steady) if steady else None, "token_seconds": times,
            "expert_read_rate": rate("expert"), "trunk_read_rate": rate("trunk"),
            "pinned_layers": s.get("pinned_layers"), "ring_slots": s.get("ring_slots")}


def measure(args) -> dict:
    from ...api import generate_ids
    from ...report.run import peak_rss_bytes

    trunks = {"first": args.trunk, "second": args.compare_trunk or args.trunk}
    engines, loads, gens, times, ids = {}, {}, {}, {}, {}
    try:
        for name, trunk in trunks.items():
            started = time.perf_counter()
            engines[name] = _engine(args.model, trunk, args, checked=name == "first" or not args.unchecked)
            loads[name] = time.perf_counter() - started
            gens[name] = generate_ids(engines[name], args.ids, engines[name].new_state())
            times[name], ids[name] = [], []
        order = list(trunks)
        for step in range(args.gen):
            for name in order if step % 2 == 0 else order[::-1]:
                started = time.perf_counter()
                token, _ = next(gens[name])
                times[name].append(time.perf_counter() - started)
                ids[name].append(token)
        rows = [_summary(n, trunks[n], engines[n], times[n], loads[n]) for n in trunks]
    finally:
        for g in gens.values():
            g.close()
        for e in engines.values():
            e.close()
    first, second = rows
    ratio = (second["seconds_per_token"] / first["seconds_per_token"]
             if first["seconds_per_token"] and second["seconds_per_token"] else None)
    return {"model": str(args.model), "trunk_gb": args.trunk_gb, "cache_gb": args.cache_gb, "gen": args.gen,
            "runs": rows, "second_vs_first_median": ratio, "same_ids": ids["first"] == ids["second"],
            "ids": ids["first"], "other_ids": None if ids["first"] == ids["second"] else ids["second"],
            "peak_rss_bytes": peak_rss_bytes()}


def pair_table(doc: dict) -> str:
    from ...units import human
    from ...report.run import gbps

    def secs(x):
        return "n/a" if x is None else f"{x:.3f}"

    same = "yes" if doc["same_ids"] else "NO"
    out = [f"two engines in one process (trunk GB {doc['trunk_gb']}, cache GB {doc['cache_gb']}), {doc['gen']} ids "
           f"each, taking turns; same ids: {same}; peak RSS {human(doc['peak_rss_bytes'])}", "",
           "| trunk | codec | pinned | load s | prefill s | s/token median | s/token mean | ÷ first | expert read | "
           "trunk read |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(doc["runs"]):
        vs = "–" if i == 0 or doc["second_vs_first_median"] is None else f"{doc['second_vs_first_median']:.3f}"
        out.append(f"| {r['trunk']} | {r['trunk_codec']} | {r['pinned_layers']} | {r['load_seconds']:.1f} | "
                   f"{r['prefill_seconds']:.2f} | {secs(r['seconds_per_token'])} | {secs(r['mean_seconds_per_token'])} "
                   f"| {vs} | {gbps(r['expert_read_rate'])} | {gbps(r['trunk_read_rate'])} |")
    return "\n".join(out)


def cmd_pair(args) -> int:
    from ...errors import UnsoundRunError, UsageError
    from ..options import parse_ids

    if (args.compare_trunk is None) != args.unchecked:
        raise UsageError("give --compare-trunk DIR (two packs) or --unchecked (one pack, read with and without checks)")
    args.ids = parse_ids(args.ids, "--ids")
    if not args.ids:
        raise UsageError("--ids: give at least one prompt id")
    if not 2 <= args.gen <= MAX_GEN:
        raise UsageError(f"--gen must be 2..{MAX_GEN} (the first id is the prefill; the median needs more), "
                         f"got {args.gen}")
    doc = measure(args)
    print(json.dumps(doc, indent=1) if args.json else pair_table(doc))
    if not doc["same_ids"]:
        second = args.compare_trunk or f"{args.trunk} read unchecked"
        raise UnsoundRunError(f"the packs disagree: {args.trunk} generated {doc['ids']}, {second} "
                              f"{doc['other_ids']}; one of them is not this checkpoint's trunk")
    return 0


def add_parser(sub) -> None:
    from ..options import GB

    p = sub.add_parser("pair", help="two packed trunks in one process, taking turns: s/token ratio, same ids",
                       description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  k3 pack /data/k3-wide /data/k3-wide-trunk-z --codec planes\n"
                              "  k3 bench pair /data/k3-wide --trunk /data/k3-wide-trunk --compare-trunk "
                              "/data/k3-wide-trunk-z --trunk-gb 5.08 --cache-gb 0.5 --gen 20\n"
                              "  k3 bench pair /data/k3-wide --trunk /data/k3-wide-trunk --unchecked --trunk-gb 2.6 "
                              "--cache-gb 0   # what checking every weight byte costs\n"
                              "memory: both engines are open at once, so the machine needs both budgets.")
    p.add_argument("model", metavar="MODEL_DIR")
    p.add_argument("--trunk", required=True, metavar="DIR", help="the first packed trunk (the baseline)")
    p.add_argument("--compare-trunk", metavar="DIR", help="the second packed trunk")
    p.add_argument("--unchecked", action="store_true", help="instead of a second pack: the first one again, read "
                   "without checking any weight byte (check_reads=false), to measure what the checks cost")
    p.add_argument("--trunk-gb", type=GB, metavar="GB", help="trunk budget of each (default: as `k3 run`)")
    p.add_argument("--cache-gb", type=GB, metavar="GB", help="expert cache of each (default: as `k3 run`)")
    p.add_argument("--ids", default="1,2,3,4,5,6,7,8", metavar="IDS", help="prompt ids (default 1,…,8)")
    p.add_argument("--gen", type=int, default=16, metavar="N", help="ids each engine generates (default 16; the "
                   "first is the prompt's prefill, the median is over the rest)")
    p.add_argument("--json", action="store_true", help="print a JSON document instead of the table")
    p.set_defaults(func=cmd_pair)
