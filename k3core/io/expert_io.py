"""Reading routed experts from the shards: where each expert's bytes lie, and concurrent positioned
reads into page-aligned buffers (aligned_io: O_DIRECT where the filesystem allows it, else buffered, said).
Each aligned run of an expert's bytes is one read, or with `read_kib` (the stores' option of that name) consecutive
reads of at most that many KiB, all in flight together on the same threads.

Stores own the buffers and decide what to keep; this module only reads, and a failed or short read, or an
expert whose bytes do not have the checksums recorded for the checkpoint (format/tensor_sums.py, checked on the
reading threads as each read lands), raises UnsoundRunError (exit 4) instead of handing back anything.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..errors import UnsoundRunError, UsageError
from ..interfaces import ExpertWeights
from ..format.checkpoint import EXPERT_PARTS, expert_prefix
from ..files.aligned_io import ALIGN, BusyClock, align_down, align_up, open_for_reading, read_into
from ..format.tensor_sums import TensorSums

QUEUE_DEPTH = 16  # expert reads in flight at once, unless the store says (its read_threads option)
MAX_QUEUE_DEPTH = 256
MAX_READ_KIB = 1 << 20  # 1 GiB: far above any expert's bytes


@dataclass(frozen=True)
class Piece:
    """One aligned run [start, start+length) of `file` (one read, or several of read_kib KiB), holding `parts` at
    their buffer offsets."""

    file: str
    start: int
    length: int
    parts: tuple  # ((part name, shape, offset in this piece's buffer, nbytes, TensorInfo), ...)


class ExpertReader:
    """Reads the experts of one checkpoint into buffers the caller owns (see `slot_bytes`)."""

    def __init__(self, checkpoint, direct_io: bool = True, check: bool = True, depth: int = QUEUE_DEPTH,
                 read_kib: int = 0):
        if not (isinstance(depth, int) and not isinstance(depth, bool) and 1 <= depth <= MAX_QUEUE_DEPTH):
            raise UsageError(f"read_threads: expert reads in flight must be an integer in 1..{MAX_QUEUE_DEPTH}, "
                             f"got {depth!r}")
        if not (isinstance(read_kib, int) and not isinstance(read_kib, bool)
                and (read_kib == 0 or (4 <= read_kib <= MAX_READ_KIB and read_kib % 4 == 0))):
            raise UsageError(f"read_kib: the KiB of each expert read must be 0 (one read per run of bytes) or a "
                             f"multiple of 4 in 4..{MAX_READ_KIB}, got {read_kib!r}")
        self.read_bytes = read_kib * 1024  # 0: each piece in one read
        self.index = checkpoint.index
        self.config = checkpoint.config
        self.sums = TensorSums.load(self.index) if check else None  # None: unchecked, to measure what checks cost
        self.direct_io = direct_io
        self.mode = "O_DIRECT" if direct_io else "buffered (O_DIRECT not asked for)"
        self._files: dict = {}
        self._layouts: dict[tuple[int, int], tuple[Piece, ...]] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(depth, thread_name_prefix="k3-expert-read")
        self.bytes_read = 0
        self.nan_scales: dict[tuple[int, int], int] = {}  # experts read that have MXFP4 scale bytes of 255: how many
        self._clock = BusyClock()  # reads may come from two threads (the fetch and the prefetch)

    def layout(self, layer: int, expert: int) -> tuple[Piece, ...]:
        """One piece when the six tensors form one gap-free run (MODEL.md §3), else one per tensor."""
        key = (layer, expert)
        if key not in self._layouts:
            infos = [self.index[expert_prefix(layer, expert) + p] for p in EXPERT_PARTS]
            groups, current = [], [infos[0]]
            for a, b in zip(infos, infos[1:]):
                if a.file == b.file and a.offset + a.nbytes == b.offset:
                    current.append(b)
                else:
                    groups.append(current)
                    current = [b]
            groups.append(current)
            pieces, names = [], iter(EXPERT_PARTS)
            for g in groups:
                start = align_down(g[0].offset)
                end = align_up(g[-1].offset + g[-1].nbytes)
                parts = tuple((next(names), i.shape, i.offset - start, i.nbytes, i) for i in g)
                pieces.append(Piece(str(g[0].file), start, end - start, parts))
            self._layouts[key] = tuple(pieces)
        return self._layouts[key]

    def slot_bytes(self, layer: int, expert: int) -> int:
        """Buffer bytes that hold any expert laid out like this one, wherever its pieces start
        relative to a 4 KiB boundary (its aligned pieces, back to back)."""
        return sum(align_up(p.parts[-1][2] + p.parts[-1][3] - p.parts[0][2]) + ALIGN
                   for p in self.layout(layer, expert))

    def read(self, requests) -> list[ExpertWeights]:
        """requests: [(layer, expert, buffer)]; reads them all concurrently (in file-offset order)
        and returns ExpertWeights viewing the buffers, in the order asked."""
        pieces = []  # (piece, its buffer, request index)
        for i, (layer, expert, buf) in enumerate(requests):
            at = 0
            for piece in self.layout(layer, expert):
                if at + piece.length > len(buf):
                    raise ValueError(f"a {len(buf)}-byte slot cannot hold expert {expert} of layer {layer}")
                pieces.append((piece, memoryview(buf)[at:at + piece.length], i))
                at += piece.length
        pieces.sort(key=lambda p: (p[0].file, p[0].start))
        # one job per read, in file-offset order: (piece, its buffer from the read's first byte on, request index)
        jobs = [(piece, view[at:], i) for piece, view, i in pieces
                for at in range(0, piece.length, self.read_bytes or piece.length)]
        with self._clock.reading():
            results = list(self._pool.map(lambda j: self._read_piece(j[0], j[1]), jobs))
        if self.sums is not None and not any(results):  # checked after the clock: read time stays read time
            jobs = pieces  # each piece whole, now that all its reads landed
            results = list(self._pool.map(lambda j: self._check_piece(j[0], j[1]), jobs))
        failures = [(job, r) for job, r in zip(jobs, results) if isinstance(r, str)]
        if failures:
            (piece, _, i), why = failures[0]
            layer, expert, _ = requests[i]
            raise UnsoundRunError(f"reading expert {expert} of layer {layer} from {piece.file} failed: {why}; "
                                  f"the ids generated so far are unsound and the run stops")
        with self._lock:
            self.bytes_read += sum(piece.length for piece, _, _ in pieces)
            if self.sums is not None:
                self._count_nan_scales(requests)
        return [self._weights(layer, expert, buf) for layer, expert, buf in requests]

    def _count_nan_scales(self, requests) -> None:
        """Experts read whose scale bytes of 255 (recorded with their checksums) MODEL.md §5 reads as zero groups."""
        for layer, expert, _ in requests:
            if (layer, expert) not in self.nan_scales:
                n = sum(self.sums.scale_255(info) for piece in self.layout(layer, expert) for *_, info in piece.parts)
                if n:
                    self.nan_scales[(layer, expert)] = n

    @property
    def seconds(self) -> float:
        """Wall time with at least one expert read in flight."""
        return self._clock.seconds

    def _weights(self, layer, expert, buf) -> ExpertWeights:
        arrays, at = {}, 0
        for piece in self.layout(layer, expert):
            for name, shape, offset, nbytes, _ in piece.parts:
                arrays[name] = np.frombuffer(buf, np.uint8, nbytes, at + offset).reshape(shape)
            at += piece.length
        return ExpertWeights(layer, expert, *(arrays[p] for p in EXPERT_PARTS))

    def _read_piece(self, piece: Piece, view: memoryview):
        """One read of `piece`: `view` is its buffer from the read's first byte to the piece's end, and the read
        fills `read_bytes` of it (all if 0 or fewer are left). Returns None, or a string saying what went wrong:
        an I/O error, or a short read that leaves out payload bytes (those before the padding up to ALIGN)."""
        at = piece.length - len(view)  # where this read starts in the piece: a multiple of ALIGN
        n = min(len(view), self.read_bytes or len(view))
        payload_end = piece.parts[-1][2] + piece.parts[-1][3]
        try:
            done = read_into(self._file(piece.file), view, piece.start + at, n)
        except OSError as exc:
            return f"{exc.strerror} (errno {exc.errno})"
        if at + done < min(at + n, payload_end):
            return f"short read: {at + done} of {payload_end} bytes at offset {piece.start}"
        return None

    def _check_piece(self, piece: Piece, view: memoryview):
        """None if each tensor the piece holds has its recorded checksum, else what differs."""
        return next((why for *_, offset, nbytes, info in piece.parts
                     if (why := self.sums.problem(info, view[offset:offset + nbytes]))), None)

    def _file(self, path: str):
        with self._lock:
            if path not in self._files:
                self._files[path] = opened = open_for_reading(path, self.direct_io)
                if self.direct_io and not opened.direct:
                    self.mode = opened.mode
            return self._files[path]

    def close(self):
        self._pool.shutdown(wait=True)
        for opened in self._files.values():
            os.close(opened.fd)
        self._files.clear()


def expert_slot_bytes(checkpoint) -> int:
    """Slot bytes for one expert of this checkpoint (all experts share one layout; 1 if none)."""
    c = checkpoint.config
    first_moe = c.first_k_dense_replace
    if first_moe >= c.num_hidden_layers:
        return 1
    return ExpertReader(checkpoint, direct_io=False, check=False).slot_bytes(first_moe, 0)
