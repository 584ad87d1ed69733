"""Our own downloader (huggingface_hub's deletes partial files): files in parallel, each written to
<dest>/.k3-partial/<name>.part as bytes arrive, hashed on the way, fsynced and recorded every second; resumed
with Range (206 + Content-Range checked; a server ignoring Range restarts that file, and says so); a stall
watchdog reconnects with backoff; renamed into place only when size and hash match. tests/wizard/test_download.py
"""
from __future__ import annotations

import os
import re
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import httpx2
from huggingface_hub import get_session

from k3core import K3Error
from k3core.report.meters import ProgressMeter

from .hub import TransientError
from .state import DONE, PARTIAL, PARTIAL_DIR, VERIFIED, SetupState
from .verify import Digest, expected, hash_file

CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class DownloadError(K3Error):
    """A file could not be downloaded (the message says which and why); finished bytes are kept."""

    exit_code = 1


class GaveUp(DownloadError):
    """Retries for one file ran out; the other files carry on."""


class Stopped(Exception):
    """The download was interrupted (Ctrl-C or another file's fatal error)."""


@dataclass
class _File:
    local: str
    url: str
    size: int
    kind: str               # what the hash is checked as: sha256, or git-sha1 for plain files
    want: str | None        # None: nothing to check against yet; the sha256 seen is recorded
    fd: int = -1
    offset: int = 0
    digest: Digest | None = None


def partial_path(dest: Path, local: str) -> Path:
    return dest / PARTIAL_DIR / f"{local}.part"


class Downloader:
    def __init__(self, hub, sha: str, dest: Path, state: SetupState, *, jobs: int = 4, stall: float = 60.0,
                 retries: int = 8, save_every: float = 1.0, backoff: float = 0.5, stream=None):
        self.hub, self.sha, self.dest, self.state = hub, sha, dest, state
        self.jobs, self.stall, self.retries, self.save_every, self.backoff = jobs, stall, retries, save_every, backoff
        self.stream, self.stop, self.open = stream, threading.Event(), {}
        self.meter: ProgressMeter | None = None

    # ---- all files -----------------------------------------------------------------------------
    def run(self, names: list[str]) -> str:
        """Download every named file that is not done; returns a one-line summary."""
        files = self.state.files
        todo = [n for n in names if files[n]["status"] not in (DONE, VERIFIED)]
        todo.sort(key=lambda n: (files[n]["size"] > (64 << 20), n))      # small files first, then shards in order
        self.meter = ProgressMeter("downloaded", sum(files[n]["size"] for n in names), len(names), stream=self.stream,
                                   done=sum(files[n]["size"] for n in names if n not in todo),
                                   done_items=len(names) - len(todo))
        failed, fatal = [], None
        pool = ThreadPoolExecutor(max(1, self.jobs), thread_name_prefix="k3-download")
        try:
            pending = {pool.submit(self._fetch, n) for n in todo}
            while pending:
                finished, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                for fut in finished:
                    exc = fut.exception()
                    if isinstance(exc, GaveUp):
                        failed.append(str(exc))
                    elif exc is not None and not isinstance(exc, Stopped) and fatal is None:
                        fatal = exc
                        self._abort()
        except BaseException:
            self._abort()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            self.meter.close()
            if self.meter.moved > (1 << 20):       # for the next run's time estimate
                self.state.set_facts(net_rate=self.meter.moved / max(time.monotonic() - self.meter.t0, 1e-3))
        if isinstance(fatal, OSError):
            raise DownloadError(f"writing into {self.dest} failed: {fatal}; finished bytes are kept: free space or "
                                "fix the disk, then run the same command again") from fatal
        if fatal is not None:
            raise fatal
        if failed:
            raise DownloadError(f"{len(failed)} file(s) did not download:\n" + "\n".join(f"  - {f}" for f in failed)
                                + "\nfinished bytes are kept: run the same command again to resume")
        return f"{len(todo)} file(s), {self.meter.summary()}" + (
            f", {self.meter.retries} reconnect(s)" if self.meter.retries else "")

    def _abort(self) -> None:
        self.stop.set()
        for response in list(self.open.values()):
            try:
                response.close()
            except Exception:   # closing from another thread may fail in any way; the worker sees stop
                pass

    # ---- one file ------------------------------------------------------------------------------
    def _fetch(self, local: str) -> None:
        if self.stop.is_set():
            raise Stopped
        rec = self.state.files[local]
        want = expected(rec)
        f = _File(local, self.hub.url(rec["remote"], self.sha), rec["size"], want[0] if want else "sha256",
                  want[1] if want else None)
        final = self.dest / local
        if not os.path.realpath(final).startswith(os.path.realpath(self.dest) + os.sep):
            raise DownloadError(f"{local}: would be written outside {self.dest}; refusing")
        if f.want and final.is_file() and final.stat().st_size == f.size and self._adopt(f, final):
            return
        part = partial_path(self.dest, local)
        part.parent.mkdir(parents=True, exist_ok=True)
        f.fd = os.open(part, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            recorded = rec.get("bytes", 0) if rec["status"] == PARTIAL else 0
            f.offset = min(os.fstat(f.fd).st_size, recorded, f.size)   # only bytes fsynced and recorded count
            os.ftruncate(f.fd, f.offset)
            self.meter.start(local, f.size)
            f.digest = hash_file(part, f.kind, f.size, lambda n: self.meter.advance(local, n, moved=False),
                                 upto=f.offset)[0]
            if f.offset:
                self.meter.message(f"{local}: resuming at byte {f.offset:,} of {f.size:,} (re-hashed what was there)")
            for attempt in (1, 2):
                self._transfer(f)
                got = f.digest.hexdigest()
                if f.want is None or got == f.want:
                    break
                why = f"{local}: {f.kind} {got[:16]}… of the downloaded bytes does not match the Hub's {f.want[:16]}…"
                self.state.log(why)
                if attempt == 2:
                    raise GaveUp(f"{why} (twice); the Hub's copy or the connection corrupts it")
                self.meter.message(f"{why}; fetching it again")
                self._restart(f)
            os.fsync(f.fd)
        finally:
            os.close(f.fd)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, final)
        _fsync_dir(final.parent)
        fields = {} if f.want else {"sha256": f.digest.hexdigest(), "origin": "measured"}
        self.state.update_file(local, status=DONE, bytes=f.size, **fields)
        self.meter.finish(local)

    def _adopt(self, f: _File, final: Path) -> bool:
        """A complete file already in place (earlier run, another tool) is kept if its hash matches."""
        self.meter.start(f.local, f.size)
        digest = hash_file(final, f.kind, f.size, lambda n: self.meter.advance(f.local, n, moved=False))[0]
        if digest.hexdigest() == f.want:
            self.state.update_file(f.local, status=DONE, bytes=f.size)
            self.meter.finish(f.local, ", already there")
            return True
        self.meter.rewind(f.local, f.size)
        self.meter.message(f"{f.local}: the file already there does not match the Hub's hash; downloading it")
        return False

    def _restart(self, f: _File) -> None:
        os.ftruncate(f.fd, 0)
        self.meter.rewind(f.local, f.offset)
        f.offset, f.digest = 0, Digest(f.kind, f.size)
        self.state.update_file(f.local, status=PARTIAL, bytes=0)

    def _transfer(self, f: _File) -> None:
        """Bring f.offset to f.size, reconnecting after cuts and stalls (bounded, with backoff)."""
        failures = 0
        while f.offset < f.size:
            if self.stop.is_set():
                raise Stopped
            before = f.offset
            try:
                self._attempt(f)
            except TransientError as exc:
                failures = 1 if f.offset > before else failures + 1
                self.meter.retry()
                self.state.log(f"{f.local}: {exc} (attempt {failures} of {self.retries})")
                if failures > self.retries:
                    raise GaveUp(f"{f.local}: {exc}; gave up after {self.retries} attempts in a row") from None
                delay = min(30.0, self.backoff * 2 ** (failures - 1))
                self.meter.message(f"{f.local}: {exc}; reconnecting in {delay:.1f} s")
                if self.stop.wait(delay):
                    raise Stopped from None

    def _attempt(self, f: _File) -> None:
        """One GET from f.offset; raises TransientError for what a new connection may cure."""
        headers = self.hub.headers(**{"Accept-Encoding": "identity"}, **(
            {"Range": f"bytes={f.offset}-"} if f.offset else {}))
        timeout = httpx2.Timeout(self.stall, connect=min(self.stall, 30.0))
        last_save, me = time.monotonic(), threading.get_ident()
        try:
            with get_session().stream("GET", f.url, headers=headers, timeout=timeout) as r:
                self.open[me] = r
                self._check_response(f, r)
                for piece in r.iter_raw():
                    if self.stop.is_set():
                        raise Stopped
                    if f.offset + len(piece) > f.size:
                        raise DownloadError(f"{f.local}: the server sent more than the listed {f.size:,} bytes")
                    _pwrite_all(f.fd, piece, f.offset)
                    f.digest.update(piece)
                    f.offset += len(piece)
                    self.meter.advance(f.local, len(piece))
                    if time.monotonic() - last_save >= self.save_every:
                        self._save(f)
                        last_save = time.monotonic()
        except httpx2.TimeoutException:
            raise TransientError(f"stalled: no bytes for {self.stall:g} s at byte {f.offset:,}") from None
        except (httpx2.TransportError, httpx2.StreamError) as exc:
            if self.stop.is_set():
                raise Stopped from None
            raise TransientError(f"connection lost at byte {f.offset:,} ({type(exc).__name__})") from None
        finally:
            self.open.pop(me, None)
            self._save(f)
        if f.offset < f.size:
            raise TransientError(f"the connection ended at byte {f.offset:,} of {f.size:,}")

    def _check_response(self, f: _File, r) -> None:
        status = r.status_code
        if status in (401, 403):
            raise self.hub.auth_error(status)
        if status == 429 or status >= 500:
            raise TransientError(f"the server answered HTTP {status}")
        if status == 416 or status not in (200, 206):
            raise DownloadError(f"{f.local}: the server answered HTTP {status} for {f.url}")
        for resp in [*r.history, r]:
            commit = resp.headers.get("X-Repo-Commit")
            if commit and commit != self.sha:
                raise DownloadError(f"{f.local}: the server sent commit {commit}, not the resolved {self.sha}")
        if status == 200:
            if f.offset:
                note = (f"{f.local}: the server ignored the Range request (200, not 206); "
                        f"starting this file again from byte 0 ({f.offset:,} bytes lost)")
                self.meter.message(note)
                self.state.log(note)
                self._restart(f)
            length = r.headers.get("Content-Length")
            if length is not None and int(length) != f.size:
                raise DownloadError(f"{f.local}: the server says {int(length):,} bytes, the listing {f.size:,}")
            return
        m = CONTENT_RANGE.fullmatch(r.headers.get("Content-Range", ""))
        if not m or int(m.group(1)) != f.offset or (m.group(3) != "*" and int(m.group(3)) != f.size):
            raise DownloadError(f"{f.local}: asked for bytes from {f.offset:,}, the server answered Content-Range "
                                f"{r.headers.get('Content-Range')!r} (file of {f.size:,} bytes)")

    def _save(self, f: _File) -> None:
        """Make f.offset bytes durable, then record them: a kill (or power cut) loses at most a second."""
        os.fsync(f.fd)
        self.state.update_file(f.local, status=PARTIAL, bytes=f.offset)


def _pwrite_all(fd: int, data: bytes, at: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, at)
        view, at = view[n:], at + n


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
