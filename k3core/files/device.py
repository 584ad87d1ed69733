"""What the block devices under some files did over a stretch of wall time, from the kernel's own counters
(/sys/dev/block/MAJOR:MINOR/stat): bytes read, and io_ticks, the milliseconds the device had at least one
request in flight. Two snapshots give the share of the time the disk was busy and the rate it delivered
while busy, counting every read that reached it (expert and trunk reads alike, whoever issued them)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

SECTOR = 512  # the stat file counts 512-byte sectors, whatever the device's own sector size
SYS_DEV_BLOCK = Path("/sys/dev/block")


@dataclass(frozen=True)
class DeviceSnapshot:
    device: str
    read_bytes: int
    busy_ms: int
    at: float  # time.perf_counter() when it was taken


def stat_file(path) -> Path | None:
    """The stat file of the block device (or partition) holding `path`; None where there is none (tmpfs,
    overlay and other filesystems without one device under them, or no /sys)."""
    dev = os.stat(path).st_dev
    stat = SYS_DEV_BLOCK / f"{os.major(dev)}:{os.minor(dev)}" / "stat"
    return stat if stat.is_file() else None


def read_snapshot(stat: Path) -> DeviceSnapshot:
    fields = stat.read_text().split()
    if len(fields) < 10:
        raise ValueError(f"{stat}: {len(fields)} fields, a block device's stat has at least 10")
    return DeviceSnapshot(stat.parent.resolve().name, int(fields[2]) * SECTOR, int(fields[9]), time.perf_counter())


def snapshots(paths) -> list[DeviceSnapshot]:
    """One snapshot per distinct device under `paths` (in the order first met)."""
    stats = []
    for path in paths:
        stat = stat_file(path)
        if stat is not None and stat not in stats:
            stats.append(stat)
    return [read_snapshot(s) for s in stats]


def activity(before: list[DeviceSnapshot], after: list[DeviceSnapshot]) -> list[dict]:
    """Per device, between two snapshots of the same devices: bytes read, seconds busy, the busy share of the
    wall time between them, and bytes per busy second (None without busy time)."""
    out = []
    for b, a in zip(before, after):
        wall, busy, read = a.at - b.at, (a.busy_ms - b.busy_ms) / 1000, a.read_bytes - b.read_bytes
        out.append({"device": a.device, "read_bytes": read, "busy_seconds": busy, "wall_seconds": wall,
                    "busy_share": busy / wall if wall > 0 else None,
                    "rate_while_busy": read / busy if busy > 0 else None})
    return out
