"""How long the wizard's steps should take, in words a person plans by: estimates from measured network,
disk and hashing rates. The progress display itself is k3's one meter (k3core.ProgressMeter)."""
from __future__ import annotations

import os

from k3core.units import human

HASH_RATE = 1.5e9   # bytes/s one core hashes sha256 (for estimates)


def estimate(nbytes: float, rate: float | None) -> str:
    """How long `nbytes` take at `rate` bytes/s, in words a person plans by."""
    if not rate:
        return "time unknown until it starts; the ETA follows"
    s = max(1, round(nbytes / rate))
    m = round(s / 60)
    return f"about {s} s" if s < 90 else f"about {m} min" if m < 90 else f"about {m // 60} h {m % 60:02d} min"


def hash_rate(disk_rate: float | None, jobs: int) -> float:
    """Bytes/s of re-reading and hashing with `jobs` threads: the disk or ~1.5 GB/s of sha256 per core."""
    return min(disk_rate or HASH_RATE, HASH_RATE * max(1, min(jobs, os.cpu_count() or 1)))


def rate_text(bps: float) -> str:
    return f"{human(bps)}/s" if bps > 0 else "-- B/s"

__all__ = ["human", "estimate", "hash_rate", "rate_text"]
