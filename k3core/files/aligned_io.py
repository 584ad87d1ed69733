"""Aligned reads for expert and trunk bytes: page-aligned buffers, descriptors opened with O_DIRECT
where the filesystem allows it (proven by one read, else buffered, and said so), and exact positioned
reads whose failure is UnsoundRunError (exit 4), never a short buffer handed on.

The one implementation of these ideas: expert reads (expert_io.py), the pinned placer and plugins use it.
"""
from __future__ import annotations

import errno
import mmap
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import UnsoundRunError

ALIGN = 4096  # O_DIRECT offsets, lengths and buffer addresses are multiples of this


def align_down(n: int) -> int:
    return n - n % ALIGN


def align_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def aligned_buffer(nbytes: int, huge: bool = False) -> mmap.mmap:
    """Private anonymous memory, page-aligned as O_DIRECT wants, at least one page. Private: Python's default
    (shared) keeps a page madvise(MADV_DONTNEED) gave back allocated, though RSS no longer counts it.

    `huge` asks for transparent huge pages (MADV_HUGEPAGE, where the kernel has them), for a buffer that O_DIRECT
    reads land in again and again (expert slots, the trunk ring): a device request takes a bounded number of
    memory segments (254 on a virtio disk), so scattered 4 KB pages cut a read into ~1 MB requests and 2 MB pages
    let it go in requests of the device's largest size (docs/STREAMING.md, "Where reads land")."""
    buf = mmap.mmap(-1, max(ALIGN, align_up(nbytes)), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge and hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    return buf


MADV_POPULATE_WRITE = 23  # Linux 5.14+: allocate a range's pages as a write would, writing nothing
PREFAULT_STEP = 32 << 20  # bytes per madvise call of a Prefault: a stop request waits for at most one


class Prefault:
    """Allocates a buffer's pages on a thread of its own (madvise MADV_POPULATE_WRITE, which writes nothing,
    so a read landing in the buffer meanwhile is safe), so that the reads which fill it first do not pay the
    page faults (with huge pages, the kernel's compaction too) while the forward pass waits for them. On a
    kernel without it (or not Linux) the thread ends at once and pages arrive on first use, as they would.
    `stop()` before the buffer goes: it ends the thread early and waits for it."""

    def __init__(self, buf):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(buf,), name="k3-prefault", daemon=True)
        self._thread.start()

    def _run(self, buf):
        import ctypes
        import sys

        if not sys.platform.startswith("linux"):
            return
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        view = (ctypes.c_char * len(buf)).from_buffer(buf)  # holds the mapping until the thread is done
        try:
            address = ctypes.addressof(view)
            for at in range(0, len(buf), PREFAULT_STEP):  # ctypes lets go of the GIL inside each call
                if self._stop.is_set() or libc.madvise(address + at, min(PREFAULT_STEP, len(buf) - at),
                                                        MADV_POPULATE_WRITE) != 0:
                    return
        finally:
            del view

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class BusyClock:
    """Wall time with at least one read in flight, however many threads read at once: a read rate is bytes
    over this, not over the sum of each read's own time."""

    def __init__(self, now=time.perf_counter):
        self.seconds, self._now = 0.0, now
        self._lock, self._busy, self._since = threading.Lock(), 0, 0.0

    @contextmanager
    def reading(self):
        self._step(+1)
        try:
            yield
        finally:
            self._step(-1)

    def _step(self, step: int) -> None:
        with self._lock:
            if self._busy == 0:
                self._since = self._now()
            self._busy += step
            if self._busy == 0:
                self.seconds += self._now() - self._since


@dataclass(frozen=True)
class Opened:
    fd: int
    direct: bool
    mode: str  # "O_DIRECT", or why the reads are buffered


def open_for_reading(path, direct: bool = True) -> Opened:
    """A read descriptor for `path`: O_DIRECT if asked and the filesystem really serves it (some take the
    flag, then refuse the first read), else buffered. Errors other than a refused O_DIRECT propagate."""
    if direct and hasattr(os, "O_DIRECT"):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        probe = aligned_buffer(ALIGN)
        try:
            os.preadv(fd, [memoryview(probe)], 0)
            return Opened(fd, True, "O_DIRECT")
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            why = f"buffered (O_DIRECT refused by the filesystem: {exc.strerror})"
        finally:
            probe.close()
        return Opened(os.open(path, os.O_RDONLY), False, why)
    return Opened(os.open(path, os.O_RDONLY), False, "buffered (O_DIRECT not asked for)")


def read_into(opened: Opened, view: memoryview, offset: int, length: int) -> int:
    """Read up to `length` bytes at `offset` into `view`; returns how many arrived (fewer only at end of
    file). OSError propagates. With O_DIRECT, offset, length and the buffer must be aligned."""
    done = 0
    while done < length:
        n = os.preadv(opened.fd, [view[done:length]], offset + done)
        if n <= 0:
            break
        done += n
        if opened.direct and n % ALIGN:  # O_DIRECT reads stop short only at end of file
            break
    return done


def read_exact(opened: Opened, view: memoryview, offset: int, length: int, need: int, what: str, path) -> None:
    """Read `length` bytes at `offset`, of which the first `need` must arrive; anything less, or an I/O
    error, is UnsoundRunError naming `what` and the file."""
    try:
        done = read_into(opened, view, offset, length)
    except OSError as exc:
        raise UnsoundRunError(f"reading {what} from {path} failed: {exc.strerror} (errno {exc.errno}); "
                              "the ids generated so far are unsound and the run stops") from None
    if done < need:
        raise UnsoundRunError(f"reading {what} from {path} failed: short read: {done} of {need} bytes at offset "
                              f"{offset}; the ids generated so far are unsound and the run stops")


@dataclass(frozen=True)
class Span:
    """`nbytes` bytes at `offset` of `path`, read into their own aligned buffer: `buffer[skip:skip + nbytes]`."""
    path: object
    offset: int
    nbytes: int
    what: str

    @property
    def start(self) -> int:
        return align_down(self.offset)

    @property
    def length(self) -> int:  # the aligned cover of [offset, offset + nbytes)
        return align_up(self.offset + self.nbytes) - self.start


PIECE = 16 << 20  # one read: large enough for the device's full rate, small enough to spread over workers


def read_spans(spans: list[Span], workers: int = 4) -> list[tuple[mmap.mmap, int]]:
    """Each span's bytes in an aligned buffer of its own, with the offset of its first byte there: the
    aligned cover read with O_DIRECT in PIECE-sized reads spread over `workers` threads (the packer's
    way of reading at disk speed), each descriptor opened once. A failed or short read is
    UnsoundRunError naming the span and file."""
    from concurrent.futures import ThreadPoolExecutor

    opened = {p: open_for_reading(p) for p in dict.fromkeys(s.path for s in spans)}
    try:
        bufs = [aligned_buffer(s.length) for s in spans]
        jobs = [(s, buf, at, min(PIECE, s.length - at)) for s, buf in zip(spans, bufs) for at in range(0, s.length, PIECE)]

        def one(job):
            s, buf, at, n = job
            end = s.offset + s.nbytes - s.start  # bytes of the cover that must arrive (the file may end before it)
            read_exact(opened[s.path], memoryview(buf)[at:at + n], s.start + at, n, max(0, min(n, end - at)),
                       s.what, s.path)

        with ThreadPoolExecutor(workers, thread_name_prefix="k3-span-read") as pool:
            list(pool.map(one, jobs))
        return [(buf, s.offset - s.start) for s, buf in zip(spans, bufs)]
    finally:
        for o in opened.values():
            os.close(o.fd)


def read_rate(spans: list[tuple[str, int, int]], seconds: float, depth: int = 16, huge: bool = True) -> dict:
    """What the disk gives: aligned (path, offset, length) spans read over and over, `depth` at a time,
    for `seconds`, with O_DIRECT where it is served (the same descriptors the engine would use), into
    buffers with huge pages as the engine's expert slots are (`huge=False`: plain 4 KB pages)."""
    from concurrent.futures import ThreadPoolExecutor

    buffers = [aligned_buffer(max(n for _, _, n in spans), huge) for _ in range(depth)]
    opened = {p: open_for_reading(p) for p in dict.fromkeys(p for p, _, _ in spans)}
    try:
        def read(job):
            (path, start, n), buf = job
            return read_into(opened[path], memoryview(buf), start, n)

        done, t0, i = 0, time.perf_counter(), 0
        with ThreadPoolExecutor(depth) as pool:
            while time.perf_counter() - t0 < seconds:
                done += sum(pool.map(read, [(spans[(i + k) % len(spans)], buffers[k]) for k in range(depth)]))
                i += depth
        elapsed = time.perf_counter() - t0
    finally:
        for o in opened.values():
            os.close(o.fd)
    return {"bytes": done, "seconds": elapsed, "rate": done / elapsed, "queue_depth": depth, "huge_pages": huge,
            "mode": next(iter(opened.values())).mode if opened else "none"}
