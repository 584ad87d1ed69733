"""`k3 bench stream`: streaming as it runs — expert read throughput against a raw O_DIRECT probe of
the same files (idle, and with every core computing), I/O share of wall time, s/token and peak RSS at
several budgets (each run in its own process, under a memory cgroup where the machine allows it), and a
projection to full K3.

Not a test: it measures and prints; it asserts nothing about speed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ...errors import UsageError
from ...interfaces import default_threads
from ...units import human
from ...machine.probes import busy_probe, raw_probe
from ...machine.cost import Drafts, Layout, Machine, fastest, projection
from ...format.checkpoint import expert_bytes, open_checkpoint, trunk_bytes_per_pass

# Full Kimi K3, per decode token (MODEL.md §1, STREAMING-FACTS): all 93 trunk layers, lm_head, 1,472 experts.
CGROUP_V1 = Path("/sys/fs/cgroup/memory")
CGROUP_V2 = Path("/sys/fs/cgroup")



def _cgroup(limit_bytes: int):
    """A memory cgroup (v1 where mounted, else v2) limited to `limit_bytes`, or None."""
    name = f"k3-bench-{os.getpid()}-{time.monotonic_ns()}"
    for root, limit_file, kind in ((CGROUP_V1, "memory.limit_in_bytes", "cgroup v1"),
                                   (CGROUP_V2, "memory.max", "cgroup v2")):
        try:
            if kind == "cgroup v2" and "memory" not in (root / "cgroup.controllers").read_text():
                continue
            path = root / name
            path.mkdir()
            (path / limit_file).write_text(str(limit_bytes))
            return path, kind
        except OSError:
            continue
    return None


def _peak_of(cg) -> int | None:
    path, kind = cg
    for name in ("memory.max_usage_in_bytes", "memory.peak"):
        try:
            return int((path / name).read_text())
        except OSError:
            continue
    return None


def run_limited(cmd: list[str], limit: int | None) -> dict:
    """`cmd` in its own process, inside a memory cgroup of `limit` bytes where the machine allows one:
    its exit code, stderr, wall time, the group's peak and the kind of limit."""
    cg = _cgroup(limit) if limit else None
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=(lambda: (cg[0] / "cgroup.procs").write_text(str(os.getpid())))
                            if cg else None)
    _, err = proc.communicate()
    wall = time.perf_counter() - started
    peak = _peak_of(cg) if cg else None
    if cg:
        cg[0].rmdir()
    return {"exit": proc.returncode, "stderr": err.decode(errors="replace"), "wall": wall, "peak": peak,
            "limit_kind": cg[1] if cg else "none (getrusage only)"}


def run_budget(model_dir, trunk_dir, trunk_gb: float, cache_gb: float, ids: str, gen: int,
               overhead_gb: float, options: tuple[str, ...] = ()) -> dict:
    """One `k3 run` of prompt `ids` (comma-separated) in its own process under a memory limit of budget + overhead;
    `options`: flags like ("--store-option", "prefetch=false") passed on."""
    with tempfile.TemporaryDirectory() as tmp:
        report, prompt = Path(tmp) / "report.json", Path(tmp) / "prompt.ids"
        prompt.write_text(ids)
        context = max(256, ids.count(",") + 1 + gen)
        cmd = [sys.executable, "-m", "k3core", "run", str(model_dir), "--trunk", str(trunk_dir), "--trunk-gb",
               str(trunk_gb), "--cache-gb", str(cache_gb), "--ids-file", str(prompt), "--gen", str(gen), "--quiet",
               "--json", str(report), "--max-context", str(context), *options]
        limit = int((trunk_gb + cache_gb + overhead_gb) * 1e9)
        ran = run_limited(cmd, limit)
        if ran["exit"] != 0:
            return {"trunk_gb": trunk_gb, "cache_gb": cache_gb, "error": ran["stderr"][-2000:],
                    "exit": ran["exit"], "limit_bytes": limit, "limit_kind": ran["limit_kind"]}
        r = json.loads(report.read_text())
    s = r["stats"]
    return {"trunk_gb": trunk_gb, "cache_gb": cache_gb, "limit_bytes": limit,
            "limit_kind": ran["limit_kind"], "process_wall_seconds": ran["wall"],
            "prefill_seconds": r["prefill_seconds"], "seconds_per_token": r["seconds_per_token"],
            "peak_rss_bytes": r["peak_rss_bytes"], "peak_cgroup_bytes": ran["peak"],
            "pinned_layers": s.get("pinned_layers"), "ring_slots": s.get("ring_slots"),
            "trunk_bytes_read": r["trunk_bytes_read"], "trunk_read_rate": r["trunk_read_rate"],
            "expert_bytes_read": r["expert_bytes_read"], "expert_read_rate": r["expert_read_rate"],
            "expert_true_hit_rate": r["expert_true_hit_rate"], "io_share_of_wall": r["io_share_of_wall"],
            "tokens": len(r["generated_ids"]), "read_modes": [s.get("trunk_read_mode"), s.get("expert_read_mode")],
            "bytes_read_per_token": r["bytes_read_per_token"], "trunk_codec": s.get("trunk_codec", "raw"),
            "trunk_decode_seconds": s.get("trunk_decode_seconds", 0.0), "trunk": str(trunk_dir),
            "options": list(options[1::2]), "expert_wait_seconds": s.get("expert_wait_seconds"),
            "expert_prefetched": s.get("expert_prefetched"), "expert_prefetch_used": s.get("expert_prefetch_used"),
            "disk_activity": r.get("disk_activity", []), "prompt_ids": len(r["prompt_ids"]),
            "prefill_io": r.get("prefill_io")}


def projections(rows: list[dict], trunks: list[tuple[Path, float]], decode_per_core: float | None,
                compute_per_core: float | None, drafts: dict[str, list[Drafts]] | None = None) -> list[dict]:
    """The real-model projection of each trunk (dir, stored ratio) at 2, 8 and 16 cores, where this run has
    what it needs: its streamed floor run (nothing pinned), whose s/token ÷ disk floor is the overhead; with
    `drafts` ({group: tokens per pass at each K}), each group's speculative s/token at its fastest K too."""
    out = []
    for trunk_dir, ratio in trunks:
        floor = next((r for r in rows if "error" not in r and r["trunk"] == str(trunk_dir) and not r["options"]
                      and r["pinned_layers"] == 0 and r.get("vs_disk_floor")), None)
        if floor is None or not compute_per_core or (ratio < 1 and not decode_per_core):
            continue
        overhead = max(1.0, floor["vs_disk_floor"])
        for cores in (2, 8, 16):
            machine = Machine(7e9, cores, decode_per_core or 1.0, compute_per_core, overhead)
            out.append({"trunk": str(trunk_dir), "codec": floor["trunk_codec"], "ratio": ratio,
                        **projection(ratio, decode_per_core or 1.0, compute_per_core, overhead, cores),
                        "speculation": {group: fastest([Layout(ratio)], machine, d)
                                        for group, d in (drafts or {}).items()}})
    return out


def trunk_ratio(trunk_dir) -> float:
    """Stored bytes ÷ restored bytes of a packed trunk (1 for a raw pack)."""
    from ...io.trunk import load_trunk

    runs = load_trunk(trunk_dir).runs.values()
    return 1.0 if all(r.codec == "raw" for r in runs) else sum(r.span for r in runs) / sum(r.length for r in runs)


def decode_rate(trunk_dir, seconds: float = 1.0) -> float:
    """Restored bytes per second on one core, decoding blocks sampled from a coded trunk (as k3 bench codec)."""
    from .codec import measure, sample_blocks
    from ...io.trunk import load_trunk

    trunk = load_trunk(trunk_dir)
    blocks = sample_blocks(trunk, 64 << 20, trunk.block_bytes)
    return measure(blocks, trunk.block_bytes, 1, seconds)["decode_gbps_one_core"] * 1e9


def default_budgets(model_dir, trunk_dirs) -> list[tuple[float, float]]:
    """(trunk GB, cache GB): the ring alone (nothing pinned, cache floor), about half the layers
    pinned with a small cache, and everything pinned with every expert cached; each the most any of the
    packs `trunk_dirs` needs for it (a coded pack's ring slots are larger: they restore in place)."""
    from ...api import EngineConfig, memory_plan

    ckpt = open_checkpoint(model_dir)
    config = ckpt.config
    experts = (config.num_hidden_layers - config.first_k_dense_replace) * config.num_experts * expert_bytes(ckpt)
    ckpt.close()

    def trunk_gb(pinned: int) -> float:  # what the pinned placer's plan holds: pinned layers + the ring
        return max(sum(r.bytes for r in memory_plan(EngineConfig(model_dir, trunk=d, trunk_placer="pinned",
                                                                  pin_layers=pinned)).trunk) for d in trunk_dirs) / 1e9 + 0.001

    n = config.num_hidden_layers
    return [(trunk_gb(0), 0.0), (trunk_gb(n // 2), 0.5), (trunk_gb(n) + 0.1, experts / 1e9 + 0.1)]


def cmd_stream(args) -> int:
    from ...io.pack import pack
    from .project import read_drafts

    model, trunk = Path(args.model), Path(args.trunk)
    source, drafts = read_drafts(args.drafts_json, args.draft_source) if args.drafts_json else (None, {})
    ids = args.ids if args.prompt_length is None else seeded_prompt(model, args.prompt_length)
    if not (trunk / "manifest.json").exists():
        print(f"packing {model} into {trunk} first …", file=sys.stderr)
        pack(model, trunk)
    budgets = args.budgets if args.budgets \
        else default_budgets(model, [trunk] + ([Path(args.compare_trunk)] if args.compare_trunk else []))
    probe = raw_probe(model, seconds=args.probe_seconds)
    busy = busy_probe(model, seconds=args.probe_seconds)
    small_pages = raw_probe(model, seconds=args.probe_seconds, huge=False)
    changed = tuple(a for o in args.compare_store_option or () for a in ("--store-option", o)) \
        + tuple(a for o in args.compare_placer_option or () for a in ("--placer-option", o))
    variants = [(trunk, ())] + ([(Path(args.compare_trunk), ())] if args.compare_trunk else []) \
        + ([(trunk, changed)] if changed else [])
    rows = [run_budget(model, d, t, c, ids, args.gen, args.overhead_gb, opts) for t, c in budgets
            for d, opts in variants]
    for r in rows:
        if "error" not in r and r["bytes_read_per_token"]:  # the disk floor: this run's bytes at the probe's rate
            r["disk_floor_seconds_per_token"] = r["bytes_read_per_token"] / probe["rate"]
            r["vs_disk_floor"] = r["seconds_per_token"] / r["disk_floor_seconds_per_token"]
    n = len(variants)
    for at in range(0, len(rows), n):  # each budget's variants against its first run
        first = rows[at]
        for other in rows[at + 1:at + n]:
            if "error" not in first and "error" not in other:
                other["vs_first_run_seconds_per_token"] = other["seconds_per_token"] / first["seconds_per_token"]
    ok = [r for r in rows if "error" not in r]
    full = max((r for r in ok if r["trunk"] == str(trunk) and not r["options"]),
               key=lambda r: r["trunk_gb"] + r["cache_gb"], default=None)
    doc = {"model": str(model), "raw_o_direct_probe": probe, "raw_o_direct_probe_busy": busy,
           "raw_o_direct_probe_small_pages": small_pages, "runs": rows,
           "overhead_gb_allowed": args.overhead_gb, "threads": default_threads()}
    if full and full["seconds_per_token"] and full["ring_slots"] == 0:  # every layer pinned: kernels, few reads
        doc["compute_bytes_per_second"] = _bytes_touched_per_token(model) / full["seconds_per_token"]
    trunks = [(d, trunk_ratio(d)) for d, opts in variants if not opts]
    coded = next((d for d, ratio in trunks if ratio < 1), None)
    if coded is not None:
        doc["decode_bytes_per_second_per_core"] = decode_rate(coded)
    compute = doc.get("compute_bytes_per_second")
    doc["draft_source"] = source
    doc["projection_k3_8gb"] = projections(rows, trunks, doc.get("decode_bytes_per_second_per_core"),
                                           compute / doc["threads"] if compute else None, drafts)
    print(json.dumps(doc, indent=1) if args.json else stream_table(doc))
    return 0


MAX_PROMPT = 1 << 16  # --prompt-length: a longer prompt is a run, not a bench


def seeded_prompt(model, n: int) -> str:
    """n ids drawn with seed 0 from the model's vocabulary, comma-separated."""
    if not 1 <= n <= MAX_PROMPT:
        raise UsageError(f"--prompt-length takes 1..{MAX_PROMPT} ids, got {n}")
    ckpt = open_checkpoint(model)
    try:
        vocab = ckpt.config.vocab_size
    finally:
        ckpt.close()
    return ",".join(str(int(i)) for i in np.random.default_rng(0).integers(0, vocab, n))


def stream_table(doc: dict) -> str:
    """The document of one `k3 bench stream` as Markdown (what docs/PERFORMANCE.md shows)."""
    probe, busy, rows = doc["raw_o_direct_probe"], doc.get("raw_o_direct_probe_busy"), doc["runs"]
    ok = [r for r in rows if "error" not in r]
    small = doc.get("raw_o_direct_probe_small_pages")
    out = [f"raw O_DIRECT probe of the expert bytes: {human(probe['rate'])}/s at queue depth {probe['queue_depth']}"
           + (f" ({human(small['rate'])}/s into 4 KB pages instead of huge ones)" if small else "")
           + (f"; {human(busy['rate'])}/s while every core computes" if busy else ""),
           "", f"| trunk | trunk GB | cache GB | limit ({ok[0]['limit_kind'] if ok else '-'}) | pinned | s/token prefill | "
           "prefill I/O share | prefill reads hidden | "
           "s/token decode | ÷ first run | read / token | disk floor | × floor | peak RSS | RSS − budget | "
           "expert read | vs probe | vs busy probe | disk busy | disk while busy, vs probe | TRUE hits | I/O share |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            out.append(f"| | {r['trunk_gb']:.2f} | {r['cache_gb']:.2f} | {human(r['limit_bytes'])} | failed (exit "
                       f"{r['exit']}) | | | | | | | | | | | | | | | | |")
            continue
        rate = r["expert_read_rate"]
        share = f"{100 * rate / probe['rate']:.0f} %" if rate else "n/a"
        busy_share = f"{100 * rate / busy['rate']:.0f} %" if rate and busy else "n/a"
        over = r["peak_rss_bytes"] - (r["trunk_gb"] + r["cache_gb"]) * 1e9
        floor = r.get("disk_floor_seconds_per_token")
        vs = r.get("vs_first_run_seconds_per_token")
        times = f"{r['vs_disk_floor']:.2f}" if floor else "n/a"
        label = ", ".join([r.get("trunk_codec", "raw"), *r.get("options", r.get("store_options", []))])
        disk_busy, disk_rate = _disk_cells(r, probe["rate"])
        out.append(f"| {label} | {r['trunk_gb']:.2f} | {r['cache_gb']:.2f} | "
                   f"{human(r['limit_bytes'])} | {r['pinned_layers']} | {r['prefill_seconds']:.2f} | "
                   f"{_prefill_cells(r.get('prefill_io'))} | "
                   f"{r['seconds_per_token']:.2f} | {f'{vs:.2f}' if vs else '–'} | "
                   f"{human(r.get('bytes_read_per_token') or 0)} | {f'{floor:.2f} s' if floor else 'n/a'} | {times} | "
                   f"{human(r['peak_rss_bytes'])} | {human(over)} | {human(rate) + '/s' if rate else 'n/a'} | {share} | {busy_share} | "
                   f"{disk_busy} | {disk_rate} | "
                   f"{100 * (r['expert_true_hit_rate'] or 0):.0f} % | {100 * (r['io_share_of_wall'] or 0):.0f} % |")
    if doc.get("compute_bytes_per_second"):
        out += ["", f"compute rate (everything resident, every expert cached): {human(doc['compute_bytes_per_second'])}/s "
                f"of weights touched on {doc['threads']} cores"]
    if doc.get("decode_bytes_per_second_per_core"):
        out.append(f"lossless trunk decode: {human(doc['decode_bytes_per_second_per_core'])}/s restored per core")
    if doc.get("projection_k3_8gb"):
        groups = list(doc["projection_k3_8gb"][0]["speculation"])
        out += ["", "projection to full Kimi K3 at 8 GB of RAM (laptop preset: the whole trunk streams, every expert "
                "read) on a 7 GB/s NVMe, from the rates above (docs/PERFORMANCE.md)"
                + (f"; speculative: tokens per pass of `{doc['draft_source']}` at its fastest K, each pass reading the "
                   "union of its rows' experts on the real routing trace" if groups else "") + ":", "",
                "| trunk | stored ratio | cores | read / token | disk | CPU | overhead (floor run ÷ its disk floor) "
                "| s/token |" + "".join(f" {doc['draft_source']}, {g}: s/token (K) |" for g in groups),
                "|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(groups)]
        for p in doc["projection_k3_8gb"]:
            out.append(f"| {p['codec']} | {p['ratio']:.4f} | {p['cores']} | {human(p['bytes_read_per_token'])} | "
                       f"{p['disk_seconds']:.1f} s | {p['cpu_seconds']:.1f} s | {p['overhead']:.2f} | "
                       f"{p['seconds_per_token']:.1f} |"
                       + "".join(f" {p['speculation'][g]['seconds_per_token']:.1f} ({p['speculation'][g]['k']}) |"
                                 for g in groups))
    return "\n".join(out)


def _prefill_cells(io: dict | None) -> str:
    """The prompt's wall time spent waiting for reads, and the share of its read time compute hid."""
    if not io or not io["bytes_read"]:
        return "n/a | n/a"
    return " | ".join("n/a" if x is None else f"{100 * x:.0f} %" for x in (io["io_share"], io["hidden"]))


def _disk_cells(r: dict, probe_rate: float) -> tuple[str, str]:
    """The busy share and rate while busy of the disk that read the most in a run (its decode), the rate against
    the probe: every reader's bytes, trunk and experts, from the kernel's counters."""
    disks = [d for d in r.get("disk_activity", []) if d["read_bytes"] > 0]
    if not disks:
        return "n/a", "n/a"
    d = max(disks, key=lambda d: d["read_bytes"])
    rate = d["rate_while_busy"]
    return (f"{100 * d['busy_share']:.0f} %" if d["busy_share"] is not None else "n/a",
            f"{human(rate)}/s, {100 * rate / probe_rate:.0f} %" if rate else "n/a")


def _bytes_touched_per_token(model) -> float:
    """Weight bytes one decode token reads on this model: every trunk tensor but the embedding
    (one row) and top-k experts in every MoE layer."""
    ckpt = open_checkpoint(model)
    c = ckpt.config
    return (trunk_bytes_per_pass(ckpt)
            + (c.num_hidden_layers - c.first_k_dense_replace) * c.num_experts_per_token * expert_bytes(ckpt))


def budget_pairs(text: str) -> list[tuple[float, float]]:
    """--budgets T:C,…: each a finite GB >= 0 (k3core/cli/options.py GB), refused by argparse naming the flag."""
    from ..options import GB

    pairs = [tuple(GB(v) for v in b.split(":")) for b in text.split(",")]
    if any(len(p) != 2 for p in pairs):
        raise argparse.ArgumentTypeError(f"takes trunk GB:cache GB pairs, comma-separated (3:0,6:0.5); got {text!r}")
    return pairs


def add_parser(sub) -> None:
    from ..options import GB, SECONDS

    p = sub.add_parser(
        "stream", help="expert reads vs a raw O_DIRECT probe, s/token and peak RSS at several budgets",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Runs `k3 run` at several trunk/cache budgets, each in its own process under a memory\n"
                    "cgroup limited to budget + --overhead-gb where the machine allows it (else peak RSS from\n"
                    "getrusage only), next to a raw O_DIRECT read probe of the same expert bytes (idle, while every\n"
                    "core computes as expert reads that overlap the kernels do, and into 4 KB pages instead of the\n"
                    "huge pages the engine's expert slots ask for); then projects\n"
                    "s/token for the full 1.56 TB model from the measured read and compute rates.",
        epilog="examples:\n  k3 make-model /data/k3-wide --shape wide && k3 pack /data/k3-wide /data/k3-wide-trunk\n"
               "  k3 bench stream /data/k3-wide --trunk /data/k3-wide-trunk\n"
               "  k3 bench stream /data/k3-wide --trunk /data/k3-wide-trunk --budgets 3:0,6:0.5 --gen 4 --json")
    p.add_argument("model", metavar="MODEL_DIR")
    p.add_argument("--trunk", required=True, metavar="DIR", help="packed trunk (made first if missing)")
    p.add_argument("--compare-trunk", metavar="DIR", help="a second pack of the same checkpoint (e.g. "
                   "`k3 pack --codec planes`), run at every budget right after the first: an s/token ratio column")
    p.add_argument("--compare-store-option", action="append", metavar="NAME=VALUE",
                   help="run every budget once more with this expert-store option (repeatable), e.g. prefetch=false: "
                        "an s/token ratio column against the default")
    p.add_argument("--compare-placer-option", action="append", metavar="NAME=VALUE",
                   help="the same for a trunk-placer option (repeatable), e.g. pin_coded=true on a coded --trunk")
    p.add_argument("--budgets", metavar="T:C,…", type=budget_pairs,
                   help="trunk GB:cache GB pairs (default: ring only, half, all)")
    p.add_argument("--ids", default="1,2,3,4,5,6,7,8", help="prompt ids (default 1..8)")
    p.add_argument("--prompt-length", type=int, metavar="N", help="a seeded prompt of N ids instead of --ids: the "
                   "prefill columns (I/O share, reads hidden behind compute) measured on a prompt that streams")
    p.add_argument("--gen", type=int, default=6, help="ids to generate per run (default 6)")
    p.add_argument("--overhead-gb", type=GB, default=1.5,
                   help="memory allowed above the budgets (Python, numpy, activations; default 1.5)")
    p.add_argument("--probe-seconds", type=SECONDS, default=3.0, help="length of each raw read probe (default 3)")
    p.add_argument("--drafts-json", metavar="FILE", help="`k3 bench drafts --transcripts … --json` output: the "
                   "projection adds speculative s/token from its tokens per pass (see `k3 bench project`)")
    p.add_argument("--draft-source", metavar="NAME", help="the draft source of --drafts-json (default: its only one, "
                   "else suffix)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_stream)
