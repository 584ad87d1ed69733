"""The run report: speed, memory and I/O of one generation, from the engine's counters and the
token timestamps. Peak RSS comes from the OS (getrusage), and RSS now from /proc, never from an estimate."""
from __future__ import annotations

import os
import resource

from ..interfaces import io_seconds
from ..units import human


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_bytes() -> int:
    """Resident set size of this process now: its resident pages in /proc/self/statm."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def per_second(nbytes, seconds):
    return nbytes / seconds if seconds > 0 else None


def run_report(engine, prompt, generated, stats, load_seconds, mode, prompt_cache=None) -> dict:
    """`stats`: a generation's "done" event stats (Session.generate): the token timestamps `stamps`, the bytes
    read from disk by each of them (`reads`), when it `started`, its passes and draft counts, the prompt ids a
    kept state gave (`reused_tokens`). `prompt_cache`: the PrefixCache the session used, if any.

    Each id after the first is a decode step; the steps that read nothing from disk (every weight they used was
    in RAM) show what compute alone costs, apart from the steps that waited on an expert's first read."""
    s, stamps, started = engine.stats(), stats["stamps"], stats["started"]
    decode = [b - a for a, b in zip(stamps, stamps[1:])]
    step_reads = [b - a for a, b in zip(stats["reads"], stats["reads"][1:])]
    in_ram = [t for t, n in zip(decode, step_reads) if n == 0]
    wall = stamps[-1] - started
    requests = s.get("expert_requests", 0)
    _, waited = io_seconds(s)
    return {
        "model": str(engine.checkpoint.root),
        "prompt_ids": list(prompt),
        "reused_prompt_ids": stats.get("reused_tokens", 0),
        "generated_ids": list(generated),
        "mode": mode,
        "load_seconds": load_seconds,
        "prefill_seconds": stamps[0] - started,
        "seconds_per_token": sum(decode) / len(decode) if decode else stamps[0] - started,
        "decode_steps": [{"seconds": t, "bytes_read": n} for t, n in zip(decode, step_reads)],
        "steps_in_ram": len(in_ram),
        "seconds_per_token_in_ram": sum(in_ram) / len(in_ram) if in_ram else None,
        "wall_seconds": wall,
        "peak_rss_bytes": peak_rss_bytes(),
        "kernels": engine.kernels.name,
        "expert_store": engine.store.name,
        "trunk_placer": engine.placer.name,
        "trunk_bytes_read": s.get("trunk_bytes_read", 0),
        "trunk_read_rate": per_second(s.get("trunk_bytes_read", 0), s.get("trunk_read_seconds", 0.0)),
        "expert_requests": requests,
        "expert_true_hit_rate": s.get("expert_hits", 0) / requests if requests else None,
        "expert_retention": (requests - s.get("expert_evictions", 0)) / requests if requests else None,
        "expert_bytes_read": s.get("expert_bytes_read", 0),
        "expert_read_rate": per_second(s.get("expert_bytes_read", 0), s.get("expert_read_seconds", 0.0)),
        "io_share_of_wall": waited / wall if wall > 0 else None,
        "prefill_io": _prefill_io(stats.get("prefill_io"), stamps[0] - started),
        "forward_passes": stats["forward_passes"],
        "draft_proposed": stats["draft_proposed"],
        "draft_accepted": stats["draft_accepted"],
        "bytes_read_per_token": stats["bytes_read_per_token"],
        "memory_plan": engine.plan.to_dict(),
        "prompt_cache": prompt_cache.stats() if prompt_cache is not None else None,
        "stats": s,
    }


def _prefill_io(io: dict | None, seconds: float) -> dict | None:
    """The prompt's reads: bytes, its wall time spent waiting for them (I/O share), and the share of the time
    reads were in flight that compute hid (reads behind compute)."""
    if not io:
        return None
    read, waited = io["read_seconds"], io["wait_seconds"]
    return {**io, "io_share": waited / seconds if seconds > 0 else None,
            "hidden": max(0.0, 1 - waited / read) if read > 0 else None}


def _prefill_line(r: dict) -> list[str]:
    io = r.get("prefill_io")
    if not io or not io["bytes_read"]:
        return []
    return [f"prefill read {io['bytes_read'] / 1e9:.3f} GB; waited {io['wait_seconds']:.2f} s for reads, "
            f"{_pct(io['io_share'])} of its wall time; {_pct(io['hidden'])} of the time reads were in flight hidden "
            "behind compute"]


def _pct(x):
    return "n/a" if x is None else f"{100 * x:.1f} %"


def gbps(x):
    return "n/a" if x is None else f"{x / 1e9:.2f} GB/s"


def _floor_line(r: dict) -> list[str]:
    if "disk_probe" not in r:
        return []
    p = r["disk_probe"]
    if not r.get("disk_floor_seconds_per_token"):
        return [f"disk: {gbps(p['rate'])} (O_DIRECT probe after the run, {p['mode']}); no disk floor: fewer than "
                "two generated ids"]
    return [f"disk floor: {_per_token(r['bytes_read_per_token'])} per generated id ÷ {gbps(p['rate'])} (O_DIRECT probe "
            f"after the run, {p['mode']}) = {r['disk_floor_seconds_per_token']:.3f} s/token; decode ran at "
            f"{r['vs_disk_floor']:.2f}× it"]


def report_text(r: dict) -> str:
    reused = f" ({r['reused_prompt_ids']} from the prompt cache)" if r.get("reused_prompt_ids") else ""
    return "\n".join([
        f"prompt {len(r['prompt_ids'])} ids{reused}, generated {len(r['generated_ids'])} ({r['mode']}); load "
        f"{r['load_seconds']:.2f} s, prefill {r['prefill_seconds']:.3f} s, decode {r['seconds_per_token']:.3f} "
        f"s/token{_in_ram_part(r)}; peak RSS {human(r['peak_rss_bytes'])}",
        f"kernels {r['kernels']}, trunk placer {r['trunk_placer']}, expert store {r['expert_store']}",
        f"trunk read {r['trunk_bytes_read'] / 1e9:.3f} GB at {gbps(r['trunk_read_rate'])}; {experts_part(r)}"
        + _prefetch_part(r["stats"]) + f"; I/O {_pct(r['io_share_of_wall'])} of wall time",
        f"{r['forward_passes']} forward passes; {_per_token(r['bytes_read_per_token'])} read per generated id after "
        "the first" + _drafts_part(r),
    ] + _prefill_line(r) + _cache_line(r) + _unchecked_line(r["stats"]) + _nan_scale_line(r["stats"])
        + _disk_lines(r) + _floor_line(r))


def experts_part(r: dict) -> str:
    """The experts' requests, TRUE hits — said what they are where they are shown: a hit counts only an expert
    resident before the request, never one read for it (a prefetch or a read just before use is a miss) —
    retention and reads."""
    return (f"experts: {r['expert_requests']} requests, TRUE hits {_pct(r['expert_true_hit_rate'])} (resident "
            f"before the request, not read for it), retention {_pct(r['expert_retention'])}, read "
            f"{r['expert_bytes_read'] / 1e9:.3f} GB at {gbps(r['expert_read_rate'])}")


def _cache_line(r: dict) -> list[str]:
    return [f"prompt cache: {prompt_cache_text(r['prompt_cache'])}"] if r.get("prompt_cache") else []


def prompt_cache_text(c: dict) -> str:
    """A PrefixCache's stats as one line, as the run report, `k3 chat`'s /stats and the page's panel say them."""
    return (f"{c['prompt_cache_checkpoints']} checkpoints, {human(c['prompt_cache_ram_bytes'])} in RAM, "
            f"{human(c['prompt_cache_disk_bytes'])} on disk; {c['prompt_cache_hits']} hits, "
            f"{c['prompt_cache_misses']} misses, {c['prompt_cache_reused_tokens']} ids reused"
            + (f", {c['prompt_cache_dropped']} damaged or foreign entries dropped" if c["prompt_cache_dropped"] else ""))


def _in_ram_part(r: dict) -> str:
    """The decode steps that read nothing from disk, when some did and some did not."""
    steps, n = len(r["decode_steps"]), r["steps_in_ram"]
    if not 0 < n < steps:
        return ""
    return f" ({r['seconds_per_token_in_ram']:.3f} over the {n} of {steps} steps that read nothing from disk)"


def _drafts_part(r: dict) -> str:
    """With speculation: which draft source proposed (its name from --draft), and how much of it was kept."""
    if not r.get("speculate"):
        return ""
    source = f" from {r['draft'].partition(':')[0]}" if r.get("draft") else ""
    share = _pct(r["draft_accepted"] / r["draft_proposed"] if r["draft_proposed"] else None)
    return f"; drafts{source}: {r['draft_accepted']} of {r['draft_proposed']} accepted ({share})"


def _nan_scale_line(s: dict) -> list[str]:
    """The experts read whose MXFP4 scale bytes of 255 MODEL.md §5 reads as zero groups, named and counted."""
    if not (found := s.get("expert_nan_scales")):
        return []
    named = ", ".join(f"layer {L} expert {e} ({n})" for L, e, n in found[:8]) + (
        f" and {len(found) - 8} more" if len(found) > 8 else "")
    return [f"MXFP4 scale byte 255 (NaN in the OCP spec) in {sum(n for *_, n in found)} group(s) of {len(found)} "
            f"expert(s) read, each group read as zero (MODEL.md §5): {named}"]


def _unchecked_line(s: dict) -> list[str]:
    off = [what for key, what in (("expert_reads_checked", "expert"), ("trunk_reads_checked", "trunk"))
           if s.get(key) is False]
    return [f"UNCHECKED: {' and '.join(off)} reads were not checked against their checksums (check_reads=false: "
            "for measuring what the checks cost only)"] if off else []


def _disk_lines(r: dict) -> list[str]:
    """The kernel's counters for each disk under the checkpoint and trunk, first generated id to the end."""
    probe = r.get("disk_probe", {}).get("rate")
    lines = []
    for d in r.get("disk_activity", []):
        rate = d["rate_while_busy"]
        vs = f" ({100 * rate / probe:.0f} % of the probe)" if rate and probe else ""
        lines.append(f"disk {d['device']} from the first id on: {d['read_bytes'] / 1e9:.3f} GB read (every reader), "
                     f"busy {_pct(d['busy_share'])} of {d['wall_seconds']:.2f} s, {gbps(rate)} while busy{vs}")
    if r.get("disk_activity_error"):
        lines.append(f"disk counters not read: {r['disk_activity_error']}")
    return lines


def _prefetch_part(s: dict) -> str:
    if not s.get("expert_prefetched"):
        return ""
    return (f", prefetched {s['expert_prefetched']} on guesses ({s.get('expert_prefetch_used', 0)} then used, "
            f"{_pct(s.get('expert_prefetch_used', 0) / s['expert_prefetched'])})")


def _per_token(x):
    return "n/a" if x is None else human(x)
