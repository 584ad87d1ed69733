"""Every tensor's checksum, recorded once (k3 setup, k3 verify, the checkpoint writer) in `k3-tensor-sums.bin`
beside the shards, and checked whenever k3 reads a tensor from the checkpoint itself: each routed expert as it
lands (expert_io), each trunk tensor the resident placer loads. A packed trunk carries its own block checksums
(io/trunk.py). The checksum is the codec's (native/planes.h: 64-bit words × odd weights), so any changed byte
changes it; it guards against bytes changing on disk or in flight, not against an adversary.

The file: MAGIC, a u64 length and a JSON header (format, version, and per shard its name, size, header sha256,
tensor count and [offset, bytes of 255] of each MXFP4 scale tensor that has any), then per shard in that order its tensors' absolute offsets (u64, ascending) and their
checksums (u64), then the sha256 of everything before it. A shard whose size or header differs from the record
makes the table stale: the run refuses to start, naming the shard and the command that checks it. `compare`
tells which shards' bytes differ from the record, so `k3 verify` never records over checksums its bytes fail.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import _native
from ..errors import CheckpointError, K3Error, UnsoundRunError
from ..files.atomic import write_bytes_atomic
from ..files.limits import INDEX_FILE_BYTES, loads_limited, read_limited
from .safetensors_index import shard_spans

FILE, MAGIC, FORMAT, VERSION = "k3-tensor-sums.bin", b"K3SUMS\0\0", "k3-tensor-sums", 1
SCALE, NAN_SCALE = ".weight_scale", 255  # MXFP4 scale tensors, and the byte MODEL.md §5 reads as a zero group
CHUNK = 64 << 20          # bytes read at a time while recording (a multiple of 8: the checksum's word)
MASK = (1 << 64) - 1


def advice(directory, recorded: bool = True) -> str:
    """What to run about the checksums of the checkpoint in `directory` (the record is missing, or differs)."""
    if not recorded:
        return (f"`k3 verify {directory}` checks the shards and records them (trusting the bytes on disk where no "
                "hash k3 setup recorded proves them)")
    return (f"`k3 verify {directory}` names each shard whose bytes differ from the record, to restore it; "
            f"`k3 verify {directory} --record` records them again from the bytes on disk, trusting them")


class RunningSum:
    """planes_checksum of a byte string given in pieces, in order: for bytes B after 8k bytes A,
    sum(A + B) = sum(A) + sum(B) + 2k * (B's words added up), all mod 2^64."""

    def __init__(self):
        self.sum, self.words, self.tail = 0, 0, b""

    def update(self, data) -> None:
        data = memoryview(data).cast("B")
        if self.tail:
            take = 8 - len(self.tail)
            self.tail, data = self.tail + bytes(data[:take]), data[take:]
            if len(self.tail) < 8:
                return
            self._add(memoryview(self.tail))
            self.tail = b""
        whole = len(data) // 8 * 8
        if whole:
            self._add(data[:whole])
        self.tail = bytes(data[whole:])

    def _add(self, words) -> None:
        added = int(np.frombuffer(words, "<u8").sum(dtype=np.uint64))
        self.sum = (self.sum + _native.planes_checksum(words) + 2 * self.words * added) & MASK
        self.words += len(words) // 8

    def value(self) -> int:
        if not self.tail:
            return self.sum
        last = RunningSum()
        last.sum, last.words = self.sum, self.words
        last._add(memoryview(self.tail + bytes(8 - len(self.tail))))
        return last.sum


class ShardSums:
    """The checksums of one shard's tensors, from its bytes as a hash pass reads them: every byte from offset 0,
    in order, in pieces of any size (`update`); `result()` once the whole file went through. Also counts each
    MXFP4 scale tensor's bytes of 255 (MODEL.md §5: such a group reads as zero, and is counted)."""

    def __init__(self, path):
        self.shard, self.starts, self.ends, self.names = shard_spans(path)
        self.running = [RunningSum() for _ in range(len(self.starts))]
        self.scales = {i: 0 for i, name in enumerate(self.names) if name.endswith(SCALE)}  # tensor -> bytes of 255
        self.at, self.next = 0, 0  # bytes seen; the first tensor not yet finished

    def update(self, data) -> None:
        data = memoryview(data).cast("B")
        lo, hi = self.at, self.at + len(data)
        i = self.next
        while i < len(self.starts):
            start, end = int(self.starts[i]), int(self.ends[i])
            if start >= hi and end > start:  # begins after this piece
                break
            if max(start, lo) < min(end, hi):
                piece = data[max(start, lo) - lo:min(end, hi) - lo]
                self.running[i].update(piece)
                if i in self.scales:
                    self.scales[i] += int(np.count_nonzero(np.frombuffer(piece, np.uint8) == NAN_SCALE))
            if end > hi:  # goes on in the next piece
                break
            i += 1
        self.at, self.next = hi, i

    def result(self) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
        """(offsets, checksums, [[offset, bytes of 255]] of each scale tensor that has any)."""
        if self.at != self.shard.size:
            raise CheckpointError(f"{self.at} of its {self.shard.size} bytes went through the checksums",
                                  file=self.shard.path)
        return (self.starts.astype(np.uint64), np.array([r.value() for r in self.running], np.uint64),
                [[int(self.starts[i]), n] for i, n in self.scales.items() if n])


def _read_through(path, advance=None) -> ShardSums:
    """A shard read front to back into its ShardSums (recording without a hash pass)."""
    sums, buf = ShardSums(path), bytearray(CHUNK)
    fd = os.open(path, os.O_RDONLY)
    try:
        while sums.at < sums.shard.size:
            n = os.preadv(fd, [memoryview(buf)[:min(CHUNK, sums.shard.size - sums.at)]], sums.at)
            if n <= 0:
                raise CheckpointError(f"file ends at byte {sums.at}, {sums.shard.size} expected", file=path)
            sums.update(memoryview(buf)[:n])
            if advance:
                advance(n)
    finally:
        os.close(fd)
    return sums


def measure(index, progress=None, jobs: int = 4, known: dict | None = None) -> list[ShardSums]:
    """Every shard of the checkpoint behind `index` (a ShardIndex) put through its ShardSums, `jobs` at a time, in
    index order. `progress(bytes_done, bytes_total)` as it goes. `known`: {shard path: ShardSums} of shards a hash
    pass already put through (not read again)."""
    known = {str(Path(k).resolve()): v for k, v in (known or {}).items()}  # the index's paths are resolved
    total, done = sum(f.size for f in index.files if str(f.path) not in known), [0]

    def advance(n):
        done[0] += n
        if progress:
            progress(done[0], total)

    def one(shard):
        sums = known.get(str(shard.path)) or _read_through(shard.path, advance)
        if sums.shard.header_sha256 != shard.header_sha256:
            raise CheckpointError("the shard changed while it was checksummed", file=shard.path)
        sums.result()  # every byte went through
        return sums

    with ThreadPoolExecutor(max(1, jobs), thread_name_prefix="k3-sums") as pool:
        return list(pool.map(one, index.files))


def write(index, measured: list[ShardSums]) -> Path:
    """FILE in the checkpoint's directory (atomically), from `measure`'s result: the bytes on disk are trusted."""
    tables = [m.result() for m in measured]
    shards = [{"name": f.path.name, "size": f.size, "header_sha256": f.header_sha256, "tensors": len(o),
               "scale_255": s255} for f, (o, _, s255) in zip(index.files, tables)]
    head = json.dumps({"format": FORMAT, "version": VERSION, "shards": shards}).encode()
    body = MAGIC + struct.pack("<Q", len(head)) + head + b"".join(o.astype("<u8").tobytes() + s.astype("<u8").tobytes()
                                                                 for o, s, _ in tables)
    path = Path(index.directory) / FILE
    write_bytes_atomic(path, body + hashlib.sha256(body).digest())
    return path


def record(index, progress=None, jobs: int = 4, known: dict | None = None) -> Path:
    """measure + write: every tensor's checksum recorded from the bytes on disk, whatever was recorded before."""
    return write(index, measure(index, progress, jobs, known))


@dataclass
class Comparison:
    """The bytes measured against FILE as it is: whether one exists, why it cannot be read (nothing is then
    compared), and per shard whose bytes it does not vouch for, what differs (naming the tensors)."""
    recorded: bool
    damaged: str | None = None
    shards: dict = field(default_factory=dict)    # shard name -> what differs, in words


def compare(index, measured: list[ShardSums]) -> Comparison:
    """Which shards' bytes (`measure`'s result) the recorded checksums do not vouch for, tensor by tensor."""
    path = Path(index.directory) / FILE
    try:
        head, tables = _parse(read_limited(path, INDEX_FILE_BYTES, "a tensor checksum file"), path)
    except FileNotFoundError:
        return Comparison(False)
    except (OSError, K3Error, _Damaged) as exc:
        return Comparison(True, f"unreadable: {getattr(exc, 'strerror', None) or exc}")
    recorded = {s["name"]: (s, t) for s, t in zip(head["shards"], tables)}
    out = Comparison(True)
    for f, m in zip(index.files, measured):
        s, t = recorded.get(f.path.name, (None, None))
        if s is None:
            out.shards[f.path.name] = f"no checksums are recorded for it in {FILE}"
        elif s["size"] != f.size or s["header_sha256"] != f.header_sha256:
            out.shards[f.path.name] = f"{f.size} bytes now, {s['size']} when its checksums were recorded" \
                if s["size"] != f.size else "its header changed since its checksums were recorded"
        else:
            offsets, sums, _ = m.result()
            if not np.array_equal(t.offsets, offsets):
                out.shards[f.path.name] = f"its tensors are not where {FILE} recorded them"
                continue
            if names := [m.names[i] for i in np.flatnonzero(t.sums != sums).tolist()]:
                more = f" and {len(names) - 3} more" if len(names) > 3 else ""
                out.shards[f.path.name] = (f"{len(names)} tensor(s) differ from their checksums recorded in {FILE}: "
                                           f"{', '.join(names[:3])}{more}")
    return out


@dataclass
class _Shard:
    offsets: np.ndarray
    sums: np.ndarray
    scale_255: dict  # offset of an MXFP4 scale tensor -> its bytes of 255


class TensorSums:
    """The recorded checksums of one checkpoint, checked against its shards when loaded."""

    def __init__(self, path: Path, shards: dict[str, _Shard]):
        self.path, self._shards = path, shards

    @classmethod
    def load(cls, index) -> "TensorSums":
        path = Path(index.directory) / FILE
        try:
            raw = read_limited(path, INDEX_FILE_BYTES, "a tensor checksum file")
        except FileNotFoundError:
            raise CheckpointError(f"this checkpoint has no tensor checksums ({FILE}), so k3 cannot check the bytes it "
                                  f"reads; {advice(index.directory, recorded=False)}", file=index.directory) from None
        try:
            head, tables = _parse(raw, path)
        except _Damaged as exc:
            raise CheckpointError(f"the tensor checksum file is damaged ({exc}); {advice(index.directory)}",
                                  file=path) from None
        mine = {f.path.name: f for f in index.files}
        recorded = {s["name"]: s for s in head["shards"]}
        for name, f in mine.items():
            s = recorded.get(name)
            if s is None or s["size"] != f.size or s["header_sha256"] != f.header_sha256:
                why = "is not in it" if s is None else "has changed since"
                raise CheckpointError(f"the tensor checksums were recorded for other shards: {name} {why}; "
                                      f"{advice(index.directory)}", file=path)
        return cls(path, {str(mine[s["name"]].path): t for s, t in zip(head["shards"], tables) if s["name"] in mine})

    def of(self, info) -> int:
        """The recorded checksum of the tensor `info` (a TensorInfo of this checkpoint)."""
        shard = self._shards.get(str(info.file))
        i = -1 if shard is None else int(np.searchsorted(shard.offsets, info.offset))
        if shard is None or i >= len(shard.offsets) or int(shard.offsets[i]) != info.offset:
            raise CheckpointError(f"no checksum was recorded for this tensor; {advice(Path(self.path).parent)}",
                                  file=self.path, tensor=info.name)
        return int(shard.sums[i])

    def scale_255(self, info) -> int:
        """Bytes of 255 recorded in the MXFP4 scale tensor `info` (groups MODEL.md §5 reads as zero)."""
        shard = self._shards.get(str(info.file))
        return 0 if shard is None else shard.scale_255.get(info.offset, 0)

    def problem(self, info, data) -> str | None:
        """None if `data` (the tensor's bytes as read) has the recorded checksum, else what differs."""
        if (got := _native.planes_checksum(memoryview(data).cast("B"))) == (want := self.of(info)):
            return None
        return (f"tensor {info.name} fails its checksum ({got:016x}, recorded {want:016x}): the checkpoint changed "
                f"on disk since its checksums were recorded; `k3 verify {Path(self.path).parent}` names every "
                "shard that changed, to restore it")

    def check(self, info, data, what: str) -> None:
        """`data` (the tensor's bytes as read) must have the recorded checksum; else UnsoundRunError naming `what`."""
        if why := self.problem(info, data):
            raise UnsoundRunError(f"{what}, read from {info.file}: {why}")


class _Damaged(ValueError):
    """FILE's bytes are not a checksum file this k3 reads: the message says why."""


def _parse(raw: bytes, path: Path) -> tuple[dict, list[_Shard]]:
    """The header and per-shard tables of FILE's bytes, or _Damaged saying what is wrong."""
    bad = _Damaged
    if len(raw) < 48 or raw[:8] != MAGIC or hashlib.sha256(raw[:-32]).digest() != raw[-32:]:
        raise bad("its own sha256 does not match" if raw[:8] == MAGIC else "not a k3 tensor checksum file")
    n = struct.unpack_from("<Q", raw, 8)[0]
    try:
        head = loads_limited(raw[16:16 + n], path)
        counts = [int(s["tensors"]) for s in head["shards"]]
        nan_scales = [{int(at): int(k) for at, k in s["scale_255"]} for s in head["shards"]]
        ok = head["format"] == FORMAT and head["version"] == VERSION
    except (ValueError, KeyError, TypeError) as exc:
        raise bad(f"header: {exc!r}") from None
    if not ok or 16 + n + 16 * sum(counts) + 32 != len(raw):
        raise bad("its header does not describe its length, or it is another version")
    tables, at = [], 16 + n
    for k, scales in zip(counts, nan_scales):
        tables.append(_Shard(np.frombuffer(raw, "<u8", k, at), np.frombuffer(raw, "<u8", k, at + 8 * k), scales))
        at += 16 * k
    return head, tables
