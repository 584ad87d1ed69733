"""File writes that never leave a mix, a temporary file, or a replaced device behind.

write_bytes_atomic / write_json_atomic / replacing (a file written in pieces): k3's own files (manifests, profile,
setup state, the prompt cache's entries): a temporary sibling, fsync, rename over the target, fsync of the
directory; a reader sees the old file or the new one, with the old file's mode (and owner, where allowed).
Output / output_file / write_output: a file a user named (--json, --dump-logits, --dump-trace, /save): the same
atomic replace over a regular file or a new path, but a device, FIFO or socket, or this process's own
stdout/stderr, is opened and written through, never replaced (see output_target). A FIFO is opened without waiting:
no reader is a UsageError, not a hang. On any failure the temporary sibling is removed.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

from ..errors import OutputError, UsageError


def fsync_dir(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _keep_owner(fd: int, old: os.stat_result) -> None:
    """Give the new file the replaced file's owner and group, as far as this process may (else its own)."""
    if (old.st_uid, old.st_gid) == (os.geteuid(), os.getegid()):
        return
    for uid in (old.st_uid, -1):  # only root may give a file away; a group this process is in is allowed
        try:
            os.fchown(fd, uid, old.st_gid)
            return
        except OSError:
            continue


@contextmanager
def replacing(target: Path):
    """A binary file that replaces `target` atomically when the block ends; if the block or the write fails, the
    temporary sibling is removed and `target` is untouched. A replaced file's mode (and owner, where this process
    may set it) carries over: the temporary file is never more readable than the file it replaces."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        old = os.stat(target)
    except OSError:  # a new file: the mode open() and the umask give it
        old = None
    mode = stat.S_IMODE(old.st_mode) if old is not None and stat.S_ISREG(old.st_mode) else None
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666 if mode is None else 0o600),
                  "wb") as f:
            if mode is not None:
                _keep_owner(f.fileno(), old)
                try:
                    os.fchmod(f.fileno(), mode)  # after fchown, which may clear set-id bits
                except OSError:
                    pass  # a file system without modes (vfat): the file is still written
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:  # a write error, ENOSPC, an exception or Ctrl-C in the block: no temporary file stays
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # the directory went away or became read-only: the original error is the one to report
        raise
    fsync_dir(target.parent)


def write_bytes_atomic(path, data: bytes) -> None:
    with replacing(Path(path)) as f:
        f.write(data)


def write_json_atomic(path, obj) -> None:
    write_bytes_atomic(path, json.dumps(obj, indent=1).encode() + b"\n")


def _our_stream(st: os.stat_result) -> int | None:
    """1 or 2 if this file is this process's stdout or stderr (`--json /dev/stdout`, also `> run.log`), else None."""
    for fd in (1, 2):
        try:
            ours = os.fstat(fd)
        except OSError:  # closed
            continue
        if (ours.st_dev, ours.st_ino) == (st.st_dev, st.st_ino):
            return fd
    return None


def unwritable(directory) -> str | None:
    """Why no file can be made in `directory` (or in the nearest of its parents that exists, for one to be made):
    "read-only file system", "permission denied", or None when it can."""
    d = Path(os.path.abspath(directory))
    while not d.exists() and d != d.parent:
        d = d.parent
    if os.access(d, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        return None
    try:
        if os.statvfs(d).f_flag & os.ST_RDONLY:
            return "read-only file system"
    except OSError:
        pass
    return "permission denied"


def output_target(path, what: str) -> tuple[Path, bool]:
    """(the path to write, whether to write through it) for an output the user named with `what` (a flag or
    command). A new path or a regular file is replaced atomically; through a symlink that ends at a regular file
    (or at nothing yet), the file at the end of the link is replaced and the link survives. Anything else that
    exists — a device, FIFO or socket, or a regular file that is this process's stdout or stderr — is opened and
    written through (`--json /dev/stdout`). A directory, a missing directory, a directory this process cannot
    write into (a read-only file system) or an unreadable path is a UsageError (exit 2) naming `what` and the path;
    check it before the work whose result goes there."""
    try:
        st = os.stat(path)
    except FileNotFoundError:  # a new path, or a symlink to a file not made yet: created at the link's end
        real = Path(os.path.realpath(path))
        if not real.parent.is_dir():
            raise UsageError(f"{what} {path}: its directory does not exist") from None
        _check_writable(real.parent, what, path)
        return real, False
    except OSError as exc:
        raise UsageError(f"{what} {path}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{what} {path}: is a directory; give a file path")
    if stat.S_ISREG(st.st_mode) and _our_stream(st) is None:
        real = Path(os.path.realpath(path))
        _check_writable(real.parent, what, path)
        return real, False
    return Path(path), True


def _check_writable(directory: Path, what: str, path) -> None:
    if why := unwritable(directory):
        raise UsageError(f"{what} {path}: cannot write into {directory}: {why}")


def _open_through(path: Path, what: str, given) -> tuple[object, int | None]:
    """(a binary file open for writing, 1 or 2 if it is this process's stdout/stderr) for a write-through target,
    opened now. A FIFO is opened without blocking: no reader is a UsageError naming `what` and the path."""
    st = os.stat(path)
    fd = _our_stream(st)
    if fd is not None:
        return open(os.dup(fd), "wb"), fd
    if stat.S_ISFIFO(st.st_mode):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nobody has the FIFO open for reading
                raise UsageError(f"{what} {given}: a FIFO with no reader; start its reader first "
                                 f"(e.g. cat {given} &), or give a file path") from None
            raise UsageError(f"{what} {given}: {exc.strerror}") from None
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)  # then write as usual
        return open(fd, "wb"), None
    if stat.S_ISSOCK(st.st_mode):
        raise UsageError(f"{what} {given}: a socket, which cannot be opened as a file; give a file, device or FIFO")
    try:
        return open(os.open(path, os.O_WRONLY), "wb"), None
    except OSError as exc:
        raise UsageError(f"{what} {given}: {exc.strerror}") from None


class Output:
    """An output the user named with `what`, checked — and a device or FIFO opened — when made, before the work
    whose result goes there; `write(data)` writes it once as output_target decides, `close()` lets go of it
    unwritten. A failed write (ENOSPC, EIO, a reader gone) is an OutputError (exit 2) naming `what` and the path."""

    def __init__(self, path, what: str):
        self.path, self.what = path, what
        self.target, self.through = output_target(path, what)
        self.file, self.stream = _open_through(self.target, what, path) if self.through else (None, None)

    @contextmanager
    def opened(self):
        """The binary file to write, once: the device, FIFO or stream opened when made, else a replacement of the
        target. A failed write is an OutputError naming `what` and the path."""
        try:
            if self.stream is not None:  # what was printed stays before, even when it is a regular file
                sys.stdout.flush()
                sys.stderr.flush()
            with (self.file if self.through else replacing(self.target)) as f:
                yield f
        except OSError as exc:
            raise OutputError(f"{self.what} {self.path}: cannot write: {exc.strerror or exc}") from None

    def write(self, data: bytes) -> None:
        with self.opened() as f:
            f.write(data)

    def close(self) -> None:
        if self.file is not None:
            try:
                self.file.close()
            except OSError:
                pass  # nothing was written: nothing to report

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@contextmanager
def output_file(path, what: str):
    """A binary file for an output the user named with `what`, written as output_target decides. A failed write
    (ENOSPC, EIO, a closed pipe) is an OutputError (exit 2) naming `what` and the path."""
    with Output(path, what) as out, out.opened() as f:
        yield f


def write_output(path, data: bytes, what: str) -> None:
    with Output(path, what) as out:
        out.write(data)
