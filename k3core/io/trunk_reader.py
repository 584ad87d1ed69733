"""Restored bytes of a packed trunk's runs, whatever its codec: what the pinned placer and `k3 pack
--verify` read through.

A raw run's bytes are read straight into the caller's aligned buffer (O_DIRECT, the cover of the range by
whole blocks, the bytes at the returned offset), in reads of up to READ_BYTES one after another: one read of
a whole layer would fill the device's queue, and the expert reads the forward pass waits for would queue
behind it. Each block that lands is checked against the manifest's checksum on a checking thread while the
next read is in flight; a mismatch is UnsoundRunError naming the pack, run and block, never a weight. A coded range is restored in place, in the caller's buffer: its
stored blocks are read into the buffer's tail, back to back in reads of up to READ_BYTES (the disk never
waits for the decoder), and restored DECODE_BLOCKS at a time, on every core, into the buffer from offset 0.
The restored bytes grow towards the stored ones but never reach a block not yet restored: a block stores
no more than it restores, and the buffer holds `slack` bytes more than the range (room()). A range that
starts or ends inside a block has that block restored into a scratch block first. Small reads (up to two
blocks: an embedding row, a norm) have private buffers, so they never wait for a layer being restored on
another thread.
"""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ..errors import TrunkError, UnsoundRunError
from ..files.aligned_io import ALIGN, BusyClock, align_down, align_up, aligned_buffer, open_for_reading, read_exact
from .. import _native
from .codec import RAW, blocks_for, restore

READ_BYTES = 16 << 20  # bytes per read of a raw range, stored bytes per read of a coded one (or one block's, if
                       # larger), at most: an expert read that comes waits behind one such read at most (16 MiB
                       # rather than 64: floor expert reads +20 %, s/token and loads the same;
                       # docs/performance-notes/trunk-reads-16mib.md)
DECODE_BLOCKS = 8      # blocks restored together, on every core, once their read has landed


def slack(n: int, block: int) -> int:
    """Buffer bytes beyond n restored bytes that an in-place restore of them needs: while DECODE_BLOCKS blocks
    from block k are restored (a cut first block counts whole), their restored end stays below block k's
    stored start if the stored bytes, padding to ALIGN included, sit this far past the range."""
    return (DECODE_BLOCKS + 1) * block + ALIGN * (n // block + 2)


def room_for(trunk, n: int) -> int:
    """Buffer bytes enough for reading any n restored bytes of `trunk` (room() of the worst range)."""
    if trunk.codec == RAW:  # the range widened to whole blocks, a part of one at each end at worst
        return align_up(n) + 2 * trunk.block_bytes
    return align_up(n + slack(n, trunk.block_bytes))


def capacity(trunk, buffer_bytes: int) -> int:
    """Restored bytes of `trunk` a buffer of buffer_bytes can always take in one read (room_for's inverse)."""
    extra = 2 * trunk.block_bytes if trunk.codec == RAW else slack(buffer_bytes, trunk.block_bytes) + ALIGN
    return max(0, buffer_bytes - extra)


def block_cover(run, lo: int, hi: int) -> tuple[int, int]:
    """Restored bytes [lo, hi) of `run` widened to whole blocks: what is read so that every byte is checked."""
    b = run.block_bytes
    return lo // b * b, min(run.length, -(-hi // b) * b)


def check_blocks(run, view, lo: int, hi: int, path) -> None:
    """`view` holds run bytes [lo, hi), whole blocks (the last one may be the run's short last block): each must
    have the manifest's checksum, or the run stops with UnsoundRunError naming the block."""
    b = run.block_bytes
    for i in range(lo // b, -(-hi // b)):
        piece = view[i * b - lo:min(hi, (i + 1) * b) - lo]
        if (got := _native.planes_checksum(piece)) != (want := run.block_sum(i)):
            raise UnsoundRunError(f"block {i} of trunk unit {run.key} ({path}) fails its checksum (read {got:016x}, "
                                  f"the manifest's {want:016x}): the packed trunk is damaged; run `k3 pack --verify` "
                                  "and re-pack")


def scratch_bytes(trunk) -> int:
    """Memory a TrunkReader of `trunk` uses besides the caller's buffers (for the memory plan): the scratch
    block of a range that cuts one, a small read's private blocks, and the exponent plane (half a block)
    each restoring thread keeps (native/planes.cpp): the decoders, the reading thread and the caller's."""
    if trunk.codec == RAW:
        return 0
    return 4 * trunk.block_bytes + (decoder_threads() + 2) * trunk.block_bytes // 2


def decoder_threads() -> int:
    return os.cpu_count() or 1


class TrunkReader:
    def __init__(self, trunk, check: bool = True):
        self.trunk, self.codec, self.check = trunk, trunk.codec, check  # check False: to measure what checks cost
        self.direct = open_for_reading(trunk.path)          # O_DIRECT where the filesystem serves it
        self.buffered = open_for_reading(trunk.path, False)  # small unaligned raw reads
        self.bytes_read = 0                                  # from disk: stored bytes, padding included
        self.decode_seconds = 0.0
        self._clock = BusyClock()                            # a load reads on several threads at once
        self._count = threading.Lock()
        self.block = trunk.block_bytes
        if self.codec == RAW:
            self._checker = ThreadPoolExecutor(1, thread_name_prefix="k3-trunk-check")  # checks while the next read flies
            self._check_blocks = check_blocks if check else (lambda *_: None)
        else:
            self._scratch = aligned_buffer(self.block)
            self._large = threading.Lock()                   # the scratch block serves one large read at a time
            self._io = ThreadPoolExecutor(1, thread_name_prefix="k3-trunk-io")  # one read at a time: experts share the disk
            self._decoders = ThreadPoolExecutor(decoder_threads(), thread_name_prefix="k3-trunk-decode")

    @property
    def mode(self) -> str:
        return self.direct.mode

    def close(self):
        if self.codec == RAW:
            self._checker.shutdown(wait=True)
        else:
            self._io.shutdown(wait=True)
            self._decoders.shutdown(wait=True)
        for opened in (self.direct, self.buffered):
            os.close(opened.fd)

    # ---- the interface ---------------------------------------------------------------------------------------
    def read(self, run, lo: int, hi: int, buf, workers: int = 1) -> int:
        """Restored bytes [lo, hi) of `run` into `buf` (aligned, at least `room(run, lo, hi)` bytes); returns
        the offset in `buf` where byte lo landed. `workers` > 1 spreads the range's reads over that many
        threads (loading, when no expert read waits for the disk)."""
        if not 0 <= lo <= hi <= run.length:
            raise TrunkError(f"run {run.key}: bytes [{lo}, {hi}) are outside its {run.length}")
        if run.codec == RAW:
            return self._read_raw(run, lo, hi, memoryview(buf).cast("B"), workers)
        if hi - lo <= 2 * self.block:  # small: private buffers
            self._restore_small(run, lo, hi, buf)
        else:
            with self._large:
                if workers > 1:
                    with ThreadPoolExecutor(workers, thread_name_prefix="k3-trunk-load") as io:
                        self._restore_in_place(run, lo, hi, buf, io)
                else:
                    self._restore_in_place(run, lo, hi, buf, self._io)
        return 0

    def read_bytes(self, run, lo: int, n: int) -> bytes:
        """n restored bytes of `run` from lo, for small unaligned reads (rows, norms)."""
        if run.codec == RAW:
            a, z = block_cover(run, lo, lo + n)
            with self._clock.reading():
                data = os.pread(self.buffered.fd, z - a, run.offset + a)
            if len(data) != z - a:
                raise UnsoundRunError(f"short read of run {run.key} bytes [{a}, {z}) from {self.trunk.path}")
            self._count_read(z - a)
            self._check_blocks(run, memoryview(data), a, z, self.trunk.path)
            return data[lo - a:lo - a + n]
        out = bytearray(n)
        self._restore_small(run, lo, lo + n, out)
        return bytes(out)

    def read_stored(self, run):
        """A coded run's stored blocks as they are on disk, in a buffer of their own: what a placer holds in RAM
        to restore later (`restore_stored`) instead of reading the run again."""
        every = list(range(len(run.blocks)))
        stored = aligned_buffer(self._stored_span(run, every))
        self._read_piece(run, every, stored)
        return stored

    def restore_stored(self, run, stored, buf) -> int:
        """All of `run` restored into `buf` from its stored blocks held in `stored` (read_stored), on every core,
        each block checked against its checksum; returns 0, where the run's first byte landed."""
        self._decode_piece(run, list(range(len(run.blocks))), stored, 0, run.length, memoryview(buf).cast("B"),
                           None, self._decoders)
        return 0

    @staticmethod
    def room(run, lo: int, hi: int) -> int:
        """Buffer bytes read(run, lo, hi, buf) needs."""
        if run.codec == RAW:
            a, z = block_cover(run, lo, hi)
            return align_up(run.offset + z) - align_down(run.offset + a)
        block = run.blocks[0].restored if run.blocks else ALIGN
        return hi - lo if hi - lo <= 2 * block else align_up(hi - lo + slack(hi - lo, block))

    @staticmethod
    def disk_bytes(run, lo: int, hi: int) -> int:
        """Bytes read(run, lo, hi, buf) reads from disk: the blocks covering [lo, hi) as stored, aligned."""
        if run.codec == RAW:
            a, z = block_cover(run, lo, hi)
            return align_up(z - a)
        first, last = run.blocks[lo // run.block_bytes], run.blocks[(hi - 1) // run.block_bytes]
        return last.offset + align_up(last.stored) - first.offset

    # ---- raw runs ------------------------------------------------------------------------------------------
    def _read_raw(self, run, lo, hi, view, workers) -> int:
        """Blocks covering [lo, hi) into `view` from 0, each checked (check_blocks) on the checking thread while
        the next read is in flight, or by the thread that read it when `workers` > 1; returns where lo landed."""
        a, z = block_cover(run, lo, hi)
        step = max(run.block_bytes, READ_BYTES // run.block_bytes * run.block_bytes)
        start = run.offset + a  # aligned: runs start aligned and blocks are multiples of ALIGN

        def one(k):
            n = min(step, z - k)
            self._timed_read(self.direct, view[k - a:k - a + align_up(n)], start + k - a, align_up(n),
                             f"trunk unit {run.key}")
            return view[k - a:k - a + n], k, k + n

        if workers > 1:
            def read_and_check(k):
                self._check_blocks(run, *one(k), self.trunk.path)
            with ThreadPoolExecutor(workers, thread_name_prefix="k3-trunk-load") as pool:
                list(pool.map(read_and_check, range(a, z, step)))
        else:
            checks = []
            try:
                for k in range(a, z, step):
                    checks.append(self._checker.submit(self._check_blocks, run, *one(k), self.trunk.path))
            finally:
                for check in checks:
                    check.exception()  # none still reads the buffer
            for check in checks:
                check.result()
        return lo - a

    # ---- coded runs ------------------------------------------------------------------------------------------
    def _restore_small(self, run, lo, hi, buf):
        idx = list(blocks_for(lo, hi, self.block))
        if idx:
            stored, scratch = aligned_buffer(self._stored_span(run, idx)), aligned_buffer(self.block)
            self._read_piece(run, idx, stored)
            self._decode_piece(run, idx, stored, lo, hi, memoryview(buf).cast("B"), scratch)

    def _restore_in_place(self, run, lo, hi, buf, io):
        """Restored bytes [lo, hi) into buf from 0, its stored blocks read into buf's tail (module docstring)."""
        idx = list(blocks_for(lo, hi, self.block))
        view, base = memoryview(buf).cast("B"), run.blocks[idx[0]].offset
        tail = align_down(len(view) - self._stored_span(run, idx))  # where the first stored block lands
        if len(view) < self.room(run, lo, hi) or tail < 0:
            raise TrunkError(f"run {run.key}: a {len(view)}-byte buffer cannot restore bytes [{lo}, {hi}) in place; "
                             f"it needs {self.room(run, lo, hi)} (TrunkReader.room)")
        reads, read = [], [idx[0]]  # consecutive blocks whose stored bytes fit one read
        for i in idx[1:]:
            if run.blocks[i].offset + align_up(run.blocks[i].stored) - run.blocks[read[0]].offset > READ_BYTES:
                reads.append(read)
                read = [i]
            else:
                read.append(i)
        reads.append(read)
        at = {i: tail + run.blocks[i].offset - base for i in idx}  # where each block's stored bytes land
        landed = [io.submit(self._read_piece, run, r, view[at[r[0]]:]) for r in reads]
        last_read = {i: k for k, r in enumerate(reads) for i in r}
        try:
            for k in range(0, len(idx), DECODE_BLOCKS):
                piece = idx[k:k + DECODE_BLOCKS]
                for future in landed[last_read[piece[0]]:last_read[piece[-1]] + 1]:
                    future.result()
                self._decode_piece(run, piece, view[at[piece[0]]:], lo, hi, view, self._scratch, self._decoders)
        finally:
            for future in landed:
                future.exception()  # a failed decode leaves no read running into the buffer

    def _stored_span(self, run, piece) -> int:
        first, last = run.blocks[piece[0]], run.blocks[piece[-1]]
        return last.offset + align_up(last.stored) - first.offset

    def _read_piece(self, run, piece, into):
        """The stored bytes of consecutive blocks `piece`, into the start of `into`."""
        first = run.blocks[piece[0]]
        self._timed_read(self.direct, memoryview(into), run.offset + first.offset, self._stored_span(run, piece),
                         f"trunk unit {run.key}, blocks {piece[0]}..{piece[-1]}")

    def _decode_piece(self, run, piece, stored, lo, hi, out, scratch, pool=None):
        """Restore consecutive blocks `piece`, their stored bytes from the start of `stored`, into `out` (which
        holds restored bytes [lo, hi)): whole blocks on `pool` (every core) when given, a block the range cuts
        through via `scratch`."""
        start, base, view = time.perf_counter(), run.blocks[piece[0]].offset, memoryview(stored)

        def one(i):
            b, b_lo = run.blocks[i], i * self.block
            stored = view[b.offset - base:b.offset - base + b.stored]
            what = f"block {i} of trunk unit {run.key} ({self.trunk.path})"
            if lo <= b_lo and b_lo + b.restored <= hi:
                restore(b, stored, out[b_lo - lo:b_lo - lo + b.restored], what)
            else:  # the range starts or ends inside this block
                restore(b, stored, scratch, what)
                a, z = max(lo, b_lo), min(hi, b_lo + b.restored)
                out[a - lo:z - lo] = memoryview(scratch)[a - b_lo:z - b_lo]

        whole = [i for i in piece if lo <= i * self.block and i * self.block + run.blocks[i].restored <= hi]
        cut = sorted(set(piece) - set(whole))
        if pool is not None:
            list(pool.map(one, whole))
        else:
            for i in whole:
                one(i)
        for i in cut:  # at most two per range: the scratch block serves them one after the other
            one(i)
        with self._count:
            self.decode_seconds += time.perf_counter() - start

    # ---- counting ----------------------------------------------------------------------------------------------
    def _timed_read(self, opened, view, offset, length, what):
        with self._clock.reading():
            read_exact(opened, view, offset, length, length, what, self.trunk.path)
        self._count_read(length)

    def _count_read(self, n):
        with self._count:
            self.bytes_read += n

    @property
    def read_seconds(self) -> float:
        """Wall time with at least one read of this trunk in flight."""
        return self._clock.seconds


def restored_sha256(reader: TrunkReader, run, chunk: int = 64 << 20, tick=None) -> str:
    """sha256 of a run's restored bytes, read through `reader` in chunks (k3 pack --verify)."""
    import hashlib

    h, buf = hashlib.sha256(), aligned_buffer(room_for(reader.trunk, chunk))
    for lo in range(0, run.length, chunk):
        hi = min(run.length, lo + chunk)
        at = reader.read(run, lo, hi, buf)
        h.update(memoryview(buf)[at:at + hi - lo])
        if tick:
            tick(hi - lo)
    return h.hexdigest()


