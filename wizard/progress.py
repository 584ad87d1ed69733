"""Progress of a step that moves or hashes many files: overall bytes, rate (last 10 s) and ETA, plus one
line per file. On a terminal the lines are redrawn in place; elsewhere (logs, CI, pipes) each finished file
prints one line and the overall line is printed every `every` seconds. Thread-safe; never raises.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque

from k3core import human as _human

WINDOW = 10.0   # seconds of history behind the rate
HASH_RATE = 1.5e9   # bytes/s one core hashes sha256 (for estimates)


def human(n: float) -> str:
    """Bytes with three significant digits, in TB from 1e12 up (k3core's human stops at GB)."""
    return f"{n / 1e12:.3g} TB" if abs(n) >= 1e12 else _human(n)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


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


class Meter:
    def __init__(self, verb: str, total_bytes: int, total_files: int, *, stream=None, done_bytes: int = 0,
                 done_files: int = 0, tty: bool | None = None, every: float = 10.0):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.verb, self.total_bytes, self.total_files, self.every = verb, total_bytes, total_files, every
        self.done_bytes, self.done_files, self.moved, self.retries = done_bytes, done_files, 0, 0
        self.active: dict[str, list] = {}            # name -> [bytes done, size, start time, bytes at start]
        self.t0 = time.monotonic()
        self.samples = deque([(self.t0, 0)])
        self.lock, self.drawn, self.last = threading.Lock(), 0, self.t0

    # ---- numbers ------------------------------------------------------------------------------
    def rate(self) -> float:
        now = time.monotonic()
        while len(self.samples) > 1 and now - self.samples[0][0] > WINDOW:
            self.samples.popleft()
        t, b = self.samples[0]
        return (self.moved - b) / (now - t) if now - t > 0.2 else 0.0

    def eta(self, remaining: int) -> float | None:
        r = self.rate()
        return remaining / r if r > 0 else None

    def summary(self) -> str:
        took = time.monotonic() - self.t0
        return f"{human(self.moved)} in {took:.1f} s ({rate_text(self.moved / max(took, 1e-9))})"

    # ---- events -------------------------------------------------------------------------------
    def start(self, name: str, size: int, done: int = 0) -> None:
        with self.lock:
            self.active[name] = [done, size, time.monotonic(), done]
            self._render(force=self.tty)

    def advance(self, name: str, n: int, moved: bool = True) -> None:
        """`n` more bytes of `name` are in place; `moved=False` for bytes only re-read (not fetched now)."""
        with self.lock:
            if name in self.active:
                self.active[name][0] += n
                self.active[name][3] += 0 if moved else n
            self.done_bytes += n
            if moved:
                self.moved += n
                self.samples.append((time.monotonic(), self.moved))
            self._render()

    def retry(self) -> None:
        with self.lock:
            self.retries += 1

    def rewind(self, name: str, n: int) -> None:
        """`n` bytes of `name` have to be moved again (a restart or a bad hash)."""
        with self.lock:
            if name in self.active:
                self.active[name][0] -= n
            self.done_bytes -= n

    def finish(self, name: str, note: str = "") -> None:
        with self.lock:
            done, size, t, start = self.active.pop(name, [0, 0, time.monotonic(), 0])
            self.done_files += 1
            took = time.monotonic() - t
            speed = f", {rate_text((done - start) / took)}" if done > start and took > 0 else ""
            self._print(f"  {self.verb} {name} ({human(size)}{speed}){note} [{self.done_files}/{self.total_files}]")

    def message(self, text: str) -> None:
        with self.lock:
            self._print(f"  {text}")

    def close(self) -> None:
        with self.lock:
            self._clear()

    # ---- drawing (caller holds the lock) ------------------------------------------------------
    def _overall(self) -> str:
        pct = 100.0 * self.done_bytes / self.total_bytes if self.total_bytes else 100.0
        extra = f", {self.retries} reconnect(s)" if self.retries else ""
        return (f"  total {human(self.done_bytes)} of {human(self.total_bytes)} ({pct:.1f} %), "
                f"{self.done_files}/{self.total_files} files, {rate_text(self.rate())}, "
                f"ETA {duration(self.eta(self.total_bytes - self.done_bytes))}{extra}")

    def _file_line(self, name: str, rec: list) -> str:
        done, size, t, start = rec
        took = time.monotonic() - t
        speed = (done - start) / took if took > 0.5 else 0.0
        left = duration((size - done) / speed) if speed > 0 else "?"
        pct = 100.0 * done / size if size else 100.0
        return f"    {name}  {human(done)} / {human(size)} ({pct:.0f} %)  {rate_text(speed)}  ETA {left}"

    def _clear(self) -> None:
        if self.drawn:
            self.stream.write("\x1b[1F\x1b[2K" * self.drawn)
            self.drawn = 0
            self.stream.flush()

    def _print(self, line: str) -> None:
        try:
            self._clear()
            print(line, file=self.stream, flush=True)
            self._render(force=self.tty)
        except (OSError, ValueError):
            pass

    def _render(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < (0.2 if self.tty else self.every):
            return
        self.last = now
        try:
            if not self.tty:
                print(self._overall(), file=self.stream, flush=True)
                return
            self._clear()
            lines = [self._file_line(n, r) for n, r in list(self.active.items())[:12]] + [self._overall()]
            self.stream.write("".join(line[:200] + "\n" for line in lines))
            self.stream.flush()
            self.drawn = len(lines)
        except (OSError, ValueError):
            pass
