"""`k3 sim-cache`: replay a recorded expert-routing trace through cache policies offline.

Policies: the reference LRU (LRUPolicy, the very object the `lru` store decides with), Belady-optimal
(MIN) and every registered expert store's own `cache_policy(slots)`. Reported per size: TRUE hit rate,
misses, GB read per token-forward, retention.
"""
from __future__ import annotations

import heapq
import json
import math
from pathlib import Path

import numpy as np

from ..errors import InputError, UsageError
from ..interfaces import CachePolicy, LRUPolicy
from ..files.limits import SMALL_FILE_BYTES, read_json_limited

DEFAULT_EXPERT_BYTES = 17_547_264  # one real K3 routed expert (w1, w2, w3 packed + scales)
K3_IN_C_PAIRS, K3_IN_C_TOKENS = 100_096, 68  # 8 full-recompute steps on 5 ids: 5+6+…+12 forwards
DEFAULT_GB = "1,4,16,36,64,128"


def read_trace(path) -> tuple[np.ndarray, dict, Path]:
    """(pairs int64 [n, 2] of (layer, expert), trace.json contents or {}, the .bin path)."""
    path = Path(path)
    meta_path, binary = path / "trace.json", (path / "expert_trace.bin" if path.is_dir() else path)
    if not binary.is_file():
        raise InputError(f"{binary}: no such trace file")
    size = binary.stat().st_size
    if size == 0 or size % 8:
        raise InputError(f"{binary}: {size} bytes is not a whole, non-zero number of "
                         "8-byte (layer, expert) int32 pairs")
    pairs = np.fromfile(binary, dtype="<i4").reshape(-1, 2).astype(np.int64)
    bad = np.flatnonzero((pairs < 0).any(axis=1))
    if bad.size:
        layer, expert = pairs[bad[0]]
        raise InputError(f"{binary}: pair {bad[0]} is (layer {layer}, expert {expert}); "
                         f"layers and experts must be non-negative ({bad.size} bad pair(s))")
    meta = {}
    if path.is_dir() and meta_path.is_file():
        try:
            meta = read_json_limited(meta_path, SMALL_FILE_BYTES, "a trace's metadata")
        except (OSError, ValueError) as exc:
            raise InputError(f"{meta_path}: not readable JSON ({exc})") from None
        if not isinstance(meta, dict):
            raise InputError(f"{meta_path}: expected a JSON object")
    return pairs, meta, binary


def _positive_int(value, what: str, err=InputError) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise err(f"{what} must be a positive integer, got {value!r}")
    return value


def resolve(pairs, meta: dict, expert_bytes=None, tokens=None) -> dict:
    """Expert bytes and token-forwards, each with where it came from."""
    if expert_bytes is not None:
        eb = (_positive_int(expert_bytes, "--expert-bytes", UsageError), "--expert-bytes")
    elif "expert_bytes" in meta:
        eb = (_positive_int(meta["expert_bytes"], "trace.json expert_bytes"), "trace.json")
    else:
        eb = (DEFAULT_EXPERT_BYTES, "default: one real K3 expert")
    if tokens is not None:
        tk = (_positive_int(tokens, "--tokens", UsageError), "--tokens")
    elif "tokens" in meta:
        tk = (_positive_int(meta["tokens"], "trace.json tokens"), "trace.json")
    elif len(pairs) == K3_IN_C_PAIRS:
        tk = (K3_IN_C_TOKENS, "the kimi-k3-in-c trace: 8 full-recompute steps on 5 ids = 5+6+...+12")
    else:
        raise UsageError(f"{len(pairs):,} requests: how many token-forwards made them? "
                         "give --tokens N (or put \"tokens\" in trace.json beside the trace)")
    return {"expert_bytes": eb[0], "expert_bytes_from": eb[1], "tokens": tk[0], "tokens_from": tk[1]}


def encode(pairs: np.ndarray) -> np.ndarray:
    """One compact int64 key per (layer, expert): 0 .. distinct − 1."""
    return np.unique(pairs, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)


def next_uses(keys: np.ndarray) -> np.ndarray:
    """For each request i, the index of the next request of the same key, else len(keys)."""
    order = np.argsort(keys, kind="stable")
    nxt = np.full(len(keys), len(keys), dtype=np.int64)
    same = keys[order[:-1]] == keys[order[1:]]
    nxt[order[:-1][same]] = order[1:][same]
    return nxt


def visit_repeats(pairs: np.ndarray, keys: np.ndarray) -> int:
    """Requests repeating an expert within one layer visit (a run of equal layers): a batched
    forward reads each distinct expert once, so these cost nothing even with no cache."""
    visit = np.cumsum(np.r_[0, np.diff(pairs[:, 0]) != 0])
    return len(keys) - len(np.unique(visit * (int(keys.max()) + 1) + keys))


def replay_belady(keys, slots: int, nxt=None) -> tuple[int, int]:
    """(hits, evictions) of Belady's MIN: on a miss with the cache full, evict the resident key
    whose next use is farthest away. A max-heap of (-next use, key) with stale entries skipped."""
    nxt = next_uses(keys) if nxt is None else nxt
    resident, heap, hits, evictions = {}, [], 0, 0
    for key, nu in zip(keys.tolist(), nxt.tolist()):
        if key in resident:
            hits += 1
        elif len(resident) >= slots:
            while True:
                far, victim = heapq.heappop(heap)
                if resident.get(victim) == -far:
                    break
            del resident[victim]
            evictions += 1
        resident[key] = nu
        heapq.heappush(heap, (-nu, key))
    return hits, evictions


def replay_policy(policy: CachePolicy, pairs: np.ndarray, slots: int) -> tuple[int, int, str]:
    """(hits, evictions, note) of a policy, one request at a time. Evictions come from its
    `evictions` counter if it keeps one, else are inferred as misses − slots (every miss is admitted)."""
    access, hits = policy.access, 0
    for layer, expert in pairs.tolist():
        hits += bool(access((layer, expert))[0])
    counted = getattr(policy, "evictions", None)
    if isinstance(counted, int):
        return hits, counted, ""
    return hits, max(0, len(pairs) - hits - slots), "retention inferred (no `evictions` counter)"


def _row(gb, slots, policy, hits, evictions, n, info, note=""):
    misses = n - hits
    return {"gb": gb, "slots": slots, "policy": policy, "hits": hits, "hit_rate": hits / n,
            "misses": misses, "evictions": evictions,
            "gb_per_token": misses * info["expert_bytes"] / info["tokens"] / 1e9,
            "retention": (n - evictions) / n, "note": note}


def _check(row, bound_hits):
    """More TRUE hits than Belady-optimal is impossible: the policy counts reads as hits."""
    if row["hits"] > bound_hits:
        row["note"] = (f"IMPOSSIBLE: {row['hits']:,} hits > Belady-optimal {bound_hits:,}; "
                       "it counts experts it did not hold as hits")


def simulate(pairs, gbs, info: dict, stores=()) -> dict:
    """The whole report: trace facts, stores that keep nothing and one row per (size, policy)."""
    keys, n = encode(pairs), len(pairs)
    nxt = next_uses(keys)
    distinct = int(np.unique(keys).size)
    rows, nothing = [], {}
    for gb in gbs:
        slots = math.floor(gb * 1e9 / info["expert_bytes"])
        if slots < 1:
            raise UsageError(f"--gb {gb:g}: {gb * 1e9:,.0f} bytes hold no expert of {info['expert_bytes']:,} bytes")
        bound = replay_belady(keys, slots, nxt)
        rows.append(_row(gb, slots, "lru", *replay_policy(LRUPolicy(slots), pairs, slots)[:2], n, info))
        rows.append(_row(gb, slots, "belady", *bound, n, info))
        for store in stores:
            policy = store.cache_policy(slots)
            if policy is None:
                nothing[store.name] = None
                continue
            hits, evictions, note = replay_policy(policy, pairs, slots)
            rows.append(_row(gb, slots, f"store:{store.name}", hits, evictions, n, info, note))
            _check(rows[-1], bound[0])
    return {**info, "requests": n, "requests_per_token": n / info["tokens"], "distinct_experts": distinct,
            "visit_repeats": visit_repeats(pairs, keys),
            "working_set_gb": distinct * info["expert_bytes"] / 1e9,
            "layers": [int(pairs[:, 0].min()), int(pairs[:, 0].max())],
            "experts": [int(pairs[:, 1].min()), int(pairs[:, 1].max())],
            "keeps_nothing": list(nothing), "rows": rows}


def parse_gb(text: str) -> list[float]:
    try:
        gbs = [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise UsageError(f"--gb {text!r}: give cache sizes in GB, comma-separated, e.g. 1,4,16") from None
    if not gbs or any(not math.isfinite(g) or g <= 0 for g in gbs):
        raise UsageError(f"--gb {text!r}: every size must be a positive number of GB")
    return gbs


def format_report(r: dict) -> str:
    lines = [f"trace {r['trace']}: {r['requests']:,} requests, layers {r['layers'][0]}..{r['layers'][1]}, "
             f"experts {r['experts'][0]}..{r['experts'][1]}; {r['distinct_experts']:,} distinct experts "
             f"= {r['working_set_gb']:.2f} GB working set",
             f"token-forwards {r['tokens']:,} ({r['tokens_from']}); "
             f"{r['requests_per_token']:,.6g} requests per token-forward",
             f"{r['visit_repeats']:,} requests ({100 * r['visit_repeats'] / r['requests']:.2f} %) repeat an expert "
             "within one layer visit (free to a batched forward; any cache holding a visit counts them as hits)",
             f"expert bytes {r['expert_bytes']:,} ({r['expert_bytes_from']})",
             f"keeps nothing: {', '.join(r['keeps_nothing']) or '-'}", "",
             "| cache GB | slots | policy | TRUE hit rate | misses | GB read / token | retention | note |",
             "|---:|---:|---|---:|---:|---:|---:|---|"]
    for w in r["rows"]:
        lines.append(f"| {w['gb']:g} | {w['slots']:,} | {w['policy']} | {100 * w['hit_rate']:.2f} % | "
                     f"{w['misses']:,} | {w['gb_per_token']:.2f} | {100 * w['retention']:.2f} % | {w['note']} |")
    return "\n".join(lines)


def cmd_sim_cache(args) -> int:
    from ..plugin_manager import expert_stores, get_plugin_manager

    gbs = parse_gb(args.gb)
    pairs, meta, binary = read_trace(args.trace)
    info = {"trace": str(binary), **resolve(pairs, meta, args.expert_bytes, args.tokens)}
    report = simulate(pairs, gbs, info, expert_stores(get_plugin_manager()))
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    return 0


def add_parser(subparsers):
    """Register `k3 sim-cache` on the CLI's subparsers."""
    import argparse

    p = subparsers.add_parser(
        "sim-cache", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="replay an expert-routing trace through cache policies (LRU, Belady, each store's)",
        description="Replay TRACE (little-endian int32 (layer, expert) pairs; or a directory with\n"
                    "expert_trace.bin and optional trace.json {\"tokens\": N, \"expert_bytes\": B}) through a\n"
                    "reference LRU, Belady-optimal and every installed expert store's cache policy.\n"
                    "Hit rates are TRUE hits: the expert was resident before it was asked for.",
        epilog="examples:\n  k3 sim-cache tests/fixtures/k3-in-c/expert_trace.bin\n"
               "  k3 sim-cache my-trace/ --gb 8,64 --json\n"
               "  k3 sim-cache trace.bin --tokens 40 --expert-bytes 17547264")
    p.add_argument("trace", metavar="TRACE", help="expert_trace.bin, or a directory holding it")
    p.add_argument("--gb", default=DEFAULT_GB, metavar="LIST",
                   help=f"expert-cache sizes in GB (1e9 bytes), comma-separated (default {DEFAULT_GB})")
    p.add_argument("--expert-bytes", type=int, metavar="N",
                   help=f"bytes of one expert (default: trace.json, else {DEFAULT_EXPERT_BYTES:,})")
    p.add_argument("--tokens", type=int, metavar="N",
                   help="token-forwards the trace covers (default: trace.json; required otherwise, "
                        f"except for the {K3_IN_C_PAIRS:,}-pair kimi-k3-in-c trace = {K3_IN_C_TOKENS})")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_sim_cache)
    return p
