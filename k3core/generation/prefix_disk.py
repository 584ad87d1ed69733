"""The prompt cache's disk tier: one file per node of the prefix tree (prefix_cache.py), so kept prompts outlive
the process. Nothing here decides what to keep; the cache calls write, read, touch and delete.

A file is `<key>.k3p` in a directory named by the model key (`model_key`: the exact weights by their recorded
tensor checksums, config.json, the kernel contract's numerics version and k3's version), so another model or
another k3 never reads it. Its bytes: MAGIC, a u64 header length, the JSON header (the node's key, its parent's,
its depth, whether it is a checkpoint, and each array's name, dtype, shape and offset), the edge's ids (int32),
the arrays, then the sha256 of everything before. A file is written whole or not at all (files/atomic.py); one
that is damaged, foreign or missing is dropped with one log line and its prefix recomputed, never trusted.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..files.atomic import replacing
from ..files.limits import loads_limited

log = logging.getLogger("k3.prompt_cache")

MAGIC, FORMAT, VERSION = b"K3PREFIX", "k3-prefix", 1
SUFFIX = ".k3p"
MAX_HEADER = 1 << 20     # a node's header: names, shapes and keys (a few kB)
NUMERICS_VERSION = 1     # the kernel contract (docs/NUMERICS.md); a change to its bits changes this
ALIGN = 64


def model_key(engine) -> str:
    """What a kept state belongs to: the model's recorded tensor checksums (their file's sha256 covers every
    tensor), config.json, the attention backends that made the states, the numerics version and k3's version."""
    from importlib.metadata import PackageNotFoundError, version

    from ..format.tensor_sums import FILE as SUMS

    root = Path(engine.checkpoint.root)
    try:
        k3 = version("k3")
    except PackageNotFoundError:
        k3 = "source"
    parts = {"format": FORMAT, "version": VERSION, "numerics": NUMERICS_VERSION, "k3": k3,
             "tensor_sums": _last_bytes(root / SUMS, 32).hex(),  # the file's own sha256, of every checksum
             "config": hashlib.sha256((root / "config.json").read_bytes()).hexdigest(),
             "attention": sorted({f"{b.kind}:{b.name}" for b in (engine.attention_for(L) for L in
                                                               range(engine.config.num_hidden_layers))})}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def node_key(model: str, ids: Sequence[int]) -> str:
    """A node's name: the model key and every id from the root to the node's end."""
    return hashlib.sha256(model.encode() + np.asarray(ids, "<i4").tobytes()).hexdigest()


@dataclass(frozen=True)
class Entry:
    """What a file says of its node, read without its arrays."""

    key: str
    parent: str | None
    depth: int
    ids: tuple[int, ...]    # the edge: the ids after the parent's end
    checkpoint: bool
    used: float             # its mtime: when it was last written or used
    size: int


class PrefixDisk:
    """The files of one model's kept prefixes under `root`, within `limit` bytes (the cache evicts; this counts)."""

    def __init__(self, root, model: str, limit: int):
        self.root, self.model, self.limit = Path(root), model, limit
        self.dir = self.root / model
        self.dir.mkdir(parents=True, exist_ok=True)
        self.bytes = 0
        self.dropped = 0  # files found damaged, foreign or missing

    def path(self, key: str) -> Path:
        return self.dir / (key + SUFFIX)

    def scan(self) -> list[Entry]:
        """Every readable entry's header and ids (damaged and foreign ones dropped), and the other models'
        directories trimmed, oldest first, to keep the root within `limit`."""
        entries = []
        for path in sorted(self.dir.iterdir()):
            if path.name.startswith(".") and path.name.endswith(".tmp"):
                _stale_temporary(path)
            elif path.suffix == SUFFIX:
                entry = self._head(path)
                if entry is not None:
                    entries.append(entry)
                    self.bytes += entry.size
        self._trim_other_models()
        return entries

    def write(self, key: str, parent: str | None, depth: int, ids: Sequence[int], checkpoint: bool,
              arrays: dict[str, np.ndarray]) -> int:
        """Write a node's file (atomically); its size. An OSError (a full disk) leaves no file and is the caller's."""
        ids_bytes = np.asarray(ids, "<i4").tobytes()
        specs, at = [], _aligned(len(ids_bytes))
        for name, a in arrays.items():
            specs.append([name, a.dtype.str, list(a.shape), at])
            at = _aligned(at + a.nbytes)
        header = json.dumps({"format": FORMAT, "version": VERSION, "model": self.model, "key": key, "parent": parent,
                             "depth": depth, "edge": len(ids), "checkpoint": checkpoint, "arrays": specs}).encode()
        start = _aligned(16 + len(header))
        digest = hashlib.sha256()
        path = self.path(key)
        old = path.stat().st_size if path.exists() else 0
        with replacing(path) as f:
            def put(data: bytes | memoryview) -> None:
                digest.update(data)
                f.write(data)

            put(MAGIC + struct.pack("<Q", len(header)) + header + bytes(start - 16 - len(header)))
            put(ids_bytes + bytes(_aligned(len(ids_bytes)) - len(ids_bytes)))
            written = _aligned(len(ids_bytes))
            for (_, _, _, offset), a in zip(specs, arrays.values()):
                put(bytes(offset - written))
                put(memoryview(np.ascontiguousarray(a)).cast("B"))
                written = offset + a.nbytes
            f.write(digest.digest())
        size = start + written + 32
        self.bytes += size - old
        return size

    def read(self, entry_key: str) -> dict[str, np.ndarray] | None:
        """A node's arrays, its checksum and header checked; None (with one log line, the file removed) when the
        file is missing, damaged or not this model's."""
        path = self.path(entry_key)
        try:
            raw = path.read_bytes()
        except OSError as exc:
            return self._drop(path, f"cannot be read ({exc.strerror or exc})")
        if len(raw) < 48 or raw[:8] != MAGIC or hashlib.sha256(raw[:-32]).digest() != raw[-32:]:
            return self._drop(path, "fails its sha256" if raw[:8] == MAGIC else "is not a k3 prompt-cache entry")
        head = self._header(raw, path)
        if head is None or head["key"] != entry_key:
            return None if head is None else self._drop(path, "holds another node")
        body = _aligned(16 + struct.unpack_from("<Q", raw, 8)[0])
        arrays = {}
        try:
            for name, dtype, shape, offset in head["arrays"]:
                count = int(np.prod(shape))
                arrays[name] = np.frombuffer(raw, np.dtype(dtype), count, body + offset).reshape(shape)
        except (ValueError, TypeError):
            return self._drop(path, "has arrays its header does not describe")
        self.touch(entry_key)
        return arrays

    def touch(self, key: str) -> None:
        try:
            os.utime(self.path(key))
        except OSError:
            pass  # gone: the next read says so

    def delete(self, key: str) -> None:
        path = self.path(key)
        try:
            size = path.stat().st_size
            path.unlink()
            self.bytes -= size
        except OSError:
            pass

    def drop(self, key: str, why: str) -> None:
        """Remove an entry found wrong, saying why in one line."""
        self._drop(self.path(key), why)

    def _head(self, path: Path) -> Entry | None:
        """The header and ids of a file found by scan (not yet counted in `bytes`)."""
        def drop(why):
            return self._drop(path, why, counted=False)

        try:
            with open(path, "rb") as f:
                start = f.read(16)
                if len(start) < 16 or start[:8] != MAGIC:
                    return drop("is not a k3 prompt-cache entry")
                n = struct.unpack_from("<Q", start, 8)[0]
                if n > MAX_HEADER:
                    return drop(f"has a {n}-byte header, over {MAX_HEADER}")
                head = self._header(start + f.read(n), path, counted=False)
                if head is None:
                    return None
                if head["key"] + SUFFIX != path.name:
                    return drop("holds another node than its name says")
                f.seek(_aligned(16 + n))
                ids = np.frombuffer(f.read(4 * head["edge"]), "<i4")
                st = os.fstat(f.fileno())
        except OSError as exc:
            return drop(f"cannot be read ({exc.strerror or exc})")
        if len(ids) != head["edge"] or head["edge"] < 1:
            return drop("is cut short")
        return Entry(head["key"], head["parent"], head["depth"], tuple(int(t) for t in ids), head["checkpoint"],
                     st.st_mtime, st.st_size)

    def _header(self, raw: bytes, path: Path, counted: bool = True) -> dict | None:
        n = struct.unpack_from("<Q", raw, 8)[0]
        try:
            head = loads_limited(raw[16:16 + n], path)
            ok = (head["format"] == FORMAT and head["version"] == VERSION and isinstance(head["key"], str)
                  and isinstance(head["depth"], int) and isinstance(head["edge"], int)
                  and isinstance(head["checkpoint"], bool) and isinstance(head["arrays"], list)
                  and (head["parent"] is None or isinstance(head["parent"], str)))
        except (ValueError, KeyError, TypeError, AttributeError):
            return self._drop(path, "has a damaged header", counted)
        if not ok:
            return self._drop(path, "is of another format or version", counted)
        if head.get("model") != self.model:
            return self._drop(path, "belongs to another model or another k3", counted)
        return head

    def _drop(self, path: Path, why: str, counted: bool = True) -> None:
        """Remove a file that cannot be trusted, saying why in one line (`counted`: its size is in `bytes`)."""
        log.warning("prompt cache: %s %s; dropped (its prefix is recomputed when asked for)", path.name, why)
        self.dropped += 1
        try:
            size = path.stat().st_size
            path.unlink()
            if counted:
                self.bytes -= size
        except OSError:
            pass
        return None

    def _trim_other_models(self) -> None:
        """Other models' (or other k3 versions') directories go, least recently used first, while the root is over
        the limit: only one model's prefixes can be resumed by this process."""
        others = []
        for d in self.root.iterdir():
            if d.is_dir() and d != self.dir:
                files = [f for f in d.iterdir() if f.is_file()]
                others.append((max((f.stat().st_mtime for f in files), default=0.0),
                               sum(f.stat().st_size for f in files), d))
        total = self.bytes + sum(size for _, size, _ in others)
        for _, size, d in sorted(others, key=lambda o: o[0]):
            if total <= self.limit:
                break
            for f in d.iterdir():
                f.unlink(missing_ok=True)
            d.rmdir()
            total -= size
            log.info("prompt cache: removed %s (another model's prefixes) to stay within the disk limit", d.name)


def _last_bytes(path: Path, n: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(-n, os.SEEK_END)
        return f.read(n)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _stale_temporary(path: Path) -> None:
    """A temporary file a write left when its process died (`.NAME.PID.THREAD.tmp`): removed."""
    try:
        pid = int(path.name.split(".")[-3])
        os.kill(pid, 0)
    except ProcessLookupError:
        path.unlink(missing_ok=True)
    except (ValueError, IndexError, PermissionError, OSError):
        pass
