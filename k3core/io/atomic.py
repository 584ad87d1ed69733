"""Atomic, durable file writes: a temporary sibling, fsync, rename over the target, fsync of the
directory. A reader (or a restart after a crash) sees the old file or the new one, never a mix."""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path


def fsync_dir(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_atomic(path, data: bytes) -> None:
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    fsync_dir(target.parent)


def write_json_atomic(path, obj) -> None:
    write_bytes_atomic(path, json.dumps(obj, indent=1).encode() + b"\n")
