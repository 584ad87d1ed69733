"""How long the wizard's steps should take, in words a person plans by: estimates from measured network,
disk and hashing rates. The progress display itself is k3's one meter (k3core.ProgressMeter)."""
from __future__ import annotations

import os

from k3core.units import human

HASH_RATE = 1.5e9   # bytes/s one core hashes sha256 (for estimates)
# `k3 pack` on a 2-core VM (issue 42): --codec planes coded `wide`'s 4.86 GB trunk in 49 s quiet, 66 s beside one
# busy process (73 MB/s): a slow, busy 2-core machine is given 40 MB/s. Raw copied it in 11 s, 3.4x one read of it
# at the disk's 1.5 GB/s: given 4x at worst. --codec auto first times the restore and compute kernels: 2.3-5.9 s
# there quiet, 5.3-8.6 s with both cores busy (the demo's whole step took 5.4 s, estimated "about 1 s"): 2-15 s.
PACK_SLOW_RATE = 40e6
CODEC_CHOICE_SECONDS = (2, 15)


def estimate(nbytes: float, rate: float | None) -> str:
    """How long `nbytes` take at `rate` bytes/s, in words a person plans by."""
    if not rate:
        return "time unknown until it starts; the ETA follows"
    return f"about {duration(nbytes / rate)}"


def duration(seconds: float) -> str:
    """`seconds` rounded as a person plans by: "12 s", "4 min", "4 h 20 min" (at least 1 s)."""
    s = max(1, round(seconds))
    m = round(s / 60)
    return f"{s} s" if s < 90 else f"{m} min" if m < 90 else f"{m // 60} h {m % 60:02d} min"


def pack_estimate(trunk_bytes: float, disk_rate: float | None, codec: str) -> str:
    """How long packing a trunk of `trunk_bytes` should take, as a range: at best each byte read and written once at
    the disk's rate; at worst coded (planes) at a slow, busy 2-core machine's rate, or for raw copied at half the
    disk's; --codec auto adds the time it takes to choose. Without a disk rate auto packs raw: time unknown."""
    if not disk_rate:
        return estimate(trunk_bytes, None)
    copy = 2 * trunk_bytes / disk_rate
    choose = CODEC_CHOICE_SECONDS if codec == "auto" else (0, 0)
    slowest = 2 * copy if codec == "raw" else trunk_bytes / PACK_SLOW_RATE
    return span(choose[0] + copy, choose[1] + max(copy, slowest))


def span(low: float, high: float) -> str:
    """From `low` to `high` seconds in words a person plans by: "2-10 s", "4-48 min", "30 s to 2 min"."""
    first, last = duration(low), duration(high)
    if first == last:
        return f"about {first}"
    number, unit = first.split(" ", 1)
    return f"{number}-{last}" if last.split(" ", 1)[1] == unit else f"{first} to {last}"


def hash_rate(disk_rate: float | None, jobs: int) -> float:
    """Bytes/s of re-reading and hashing with `jobs` threads: the disk or ~1.5 GB/s of sha256 per core."""
    return min(disk_rate or HASH_RATE, HASH_RATE * max(1, min(jobs, os.cpu_count() or 1)))


def rate_text(bps: float) -> str:
    return f"{human(bps)}/s" if bps > 0 else "-- B/s"

__all__ = ["human", "estimate", "hash_rate", "pack_estimate", "rate_text", "span"]
