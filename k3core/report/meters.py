"""The one progress display of long work: `k3 setup`'s download and verify steps, `k3 pack`, `k3 make-model`.
Bytes (or shards) done of a total over many items (files, runs), rate over the last 10 s, ETA.

On a terminal: a tqdm bar whose description names the items under way, each finished item printed
above it. Elsewhere (logs, CI, pipes): plain lines, one per finished item, and the overall line every
`every` seconds; no escape codes. Thread-safe; drawing never raises into the work it reports on.
"""
from __future__ import annotations

import sys
import threading
import time
from collections import deque

from tqdm import tqdm

from ..units import human

WINDOW = 10.0  # seconds of history behind the rate


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def rate_text(bps: float, unit: str = "B") -> str:
    if unit != "B":
        return f"{bps:.1f} {unit}/s" if bps > 0 else f"-- {unit}/s"
    return f"{human(bps)}/s" if bps > 0 else "-- B/s"


class ProgressMeter:
    """`verb` names what happens to an item ("downloaded", "packed"); `total` is in `unit` ("B" for bytes)."""

    def __init__(self, verb: str, total: int, items: int, *, stream=None, unit: str = "B", done: int = 0,
                 done_items: int = 0, tty: bool | None = None, every: float = 10.0):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.verb, self.total, self.items, self.unit, self.every = verb, total, items, unit, every
        self.done, self.done_items, self.moved, self.retries = done, done_items, 0, 0
        self.active: dict[str, list] = {}   # name -> [done, size, start time, done at start]
        self.t0 = self.last = time.monotonic()
        self.samples = deque([(self.t0, 0)])
        self.lock = threading.Lock()
        self.bar = None
        if self.tty:
            self.bar = tqdm(total=total, initial=done, unit=unit, unit_scale=unit == "B", unit_divisor=1000,
                            file=self.stream, dynamic_ncols=True, mininterval=0.2, leave=False, desc=verb,
                            bar_format="{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} "
                                       "[{elapsed}<{remaining}, {rate_fmt}]{postfix}")

    # ---- numbers --------------------------------------------------------------------------------
    def rate(self) -> float:
        now = time.monotonic()
        while len(self.samples) > 1 and now - self.samples[0][0] > WINDOW:
            self.samples.popleft()
        t, moved = self.samples[0]
        return (self.moved - moved) / (now - t) if now - t > 0.2 else 0.0

    def eta(self) -> float | None:
        r = self.rate()
        return (self.total - self.done) / r if r > 0 else None

    def summary(self) -> str:
        took = time.monotonic() - self.t0
        amount = human(self.moved) if self.unit == "B" else f"{self.moved} {self.unit}"
        return f"{amount} in {took:.1f} s ({rate_text(self.moved / max(took, 1e-9), self.unit)})"

    # ---- events ---------------------------------------------------------------------------------
    def start(self, name: str, size: int, done: int = 0) -> None:
        with self.lock:
            self.active[name] = [done, size, time.monotonic(), done]
            self._describe()

    def advance(self, name: str, n: int, moved: bool = True) -> None:
        """`n` more units of `name` are in place; `moved=False` for units only re-read (not moved now)."""
        with self.lock:
            if name in self.active:
                self.active[name][0] += n
                self.active[name][3] += 0 if moved else n
            self.done += n
            if moved:
                self.moved += n
                self.samples.append((time.monotonic(), self.moved))
            self._draw(n)

    def set_done(self, name: str, done: int) -> None:
        """Everything up to `done` units is in place, `name` under way (for callers that count in totals)."""
        with self.lock:
            step = done - self.done
        if name not in self.active:
            self.start(name, 0)
        self.advance(name, step)

    def retry(self) -> None:
        with self.lock:
            self.retries += 1

    def rewind(self, name: str, n: int) -> None:
        """`n` units of `name` have to be moved again (a restart or a bad hash)."""
        with self.lock:
            if name in self.active:
                self.active[name][0] -= n
            self.done -= n
            self._draw(-n)

    def finish(self, name: str, note: str = "") -> None:
        with self.lock:
            done, size, t, start = self.active.pop(name, [0, 0, time.monotonic(), 0])
            self.done_items += 1
            took = time.monotonic() - t
            speed = f", {rate_text((done - start) / took, self.unit)}" if done > start and took > 0 else ""
            amount = f"{human(max(size, done))}{speed}" if self.unit == "B" else (speed[2:] if speed else "")
            self._print(f"  {self.verb} {name}" + (f" ({amount})" if amount else "") + f"{note} "
                        f"[{self.done_items}/{self.items}]")
            self._describe()

    def message(self, text: str) -> None:
        with self.lock:
            self._print(f"  {text}")

    def close(self) -> None:
        with self.lock:
            if self.bar is not None:
                try:
                    self.bar.close()
                except (OSError, ValueError):
                    pass
                self.bar = None

    # ---- drawing (the caller holds the lock) ------------------------------------------------------
    def overall(self) -> str:
        pct = 100.0 * self.done / self.total if self.total else 100.0
        extra = f", {self.retries} reconnect(s)" if self.retries else ""
        amount = f"{human(self.done)} of {human(self.total)}" if self.unit == "B" else \
            f"{self.done} of {self.total} {self.unit}"
        return (f"  total {amount} ({pct:.1f} %), {self.done_items}/{self.items} items, "
                f"{rate_text(self.rate(), self.unit)}, ETA {duration(self.eta())}{extra}")

    def _describe(self) -> None:
        if self.bar is not None:
            names = list(self.active)
            shown = ", ".join(names[:3]) + (f" +{len(names) - 3}" if len(names) > 3 else "")
            try:
                self.bar.set_description_str(f"{self.verb} {self.done_items}/{self.items}" +
                                             (f" ({shown})" if shown else ""), refresh=False)
            except (OSError, ValueError):
                pass

    def _draw(self, n: int) -> None:
        try:
            if self.bar is not None:
                self.bar.update(n)
                return
            now = time.monotonic()
            if now - self.last >= self.every:
                self.last = now
                print(self.overall(), file=self.stream, flush=True)
        except (OSError, ValueError):
            pass

    def _print(self, line: str) -> None:
        try:
            if self.bar is not None:
                self.bar.write(line, file=self.stream)
            else:
                print(line, file=self.stream, flush=True)
        except (OSError, ValueError):
            pass


class PackMeter:
    """A `k3 pack` progress callback (io.pack.Progress events) shown on the one meter."""

    def __init__(self, stream=None, verb: str = "packed"):
        self.stream, self.verb, self.meter = stream or sys.stderr, verb, None

    def __call__(self, p) -> None:
        if self.meter is None:
            self.meter = ProgressMeter(self.verb, p.bytes_total, p.runs_total, stream=self.stream,
                                       done=p.bytes_done - p.moved, done_items=p.runs_done - p.run_finished)
        self.meter.set_done(p.key, p.bytes_done)
        if p.run_finished:
            self.meter.finish(p.key)

    def close(self) -> None:
        if self.meter is not None:
            self.meter.close()
