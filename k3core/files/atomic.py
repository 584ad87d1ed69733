"""File writes that never leave a mix, a temporary file, or a replaced device behind.

write_bytes_atomic / write_json_atomic / replacing (a file written in pieces): k3's own files (manifests, profile,
setup state, the prompt cache's entries): a temporary sibling, fsync, rename over the target, fsync of the
directory; a reader sees the old file or the new one.
output_file / write_output: a file a user named (--json, --dump-logits, --dump-trace, /save): the same atomic
replace over a regular file or a new path, but a device, FIFO or socket, or this process's own stdout/stderr, is
opened and written through, never replaced (see output_target). On any failure the temporary sibling is removed.
"""
from __future__ import annotations

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


@contextmanager
def replacing(target: Path):
    """A binary file that replaces `target` atomically when the block ends; if the block or the write fails, the
    temporary sibling is removed and `target` is untouched."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
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


def output_target(path, what: str) -> tuple[Path, bool]:
    """(the path to write, whether to write through it) for an output the user named with `what` (a flag or
    command). A new path or a regular file is replaced atomically; through a symlink that ends at a regular file
    (or at nothing yet), the file at the end of the link is replaced and the link survives. Anything else that
    exists — a device, FIFO or socket, or a regular file that is this process's stdout or stderr — is opened and
    written through (`--json /dev/stdout`). A directory, a missing directory or an unreadable path is a UsageError
    (exit 2) naming `what` and the path; check it before the work whose result goes there."""
    try:
        st = os.stat(path)
    except FileNotFoundError:  # a new path, or a symlink to a file not made yet: created at the link's end
        real = Path(os.path.realpath(path))
        if not real.parent.is_dir():
            raise UsageError(f"{what} {path}: its directory does not exist") from None
        return real, False
    except OSError as exc:
        raise UsageError(f"{what} {path}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{what} {path}: is a directory; give a file path")
    if stat.S_ISREG(st.st_mode) and _our_stream(st) is None:
        return Path(os.path.realpath(path)), False
    return Path(path), True


@contextmanager
def _writing_through(path: Path):
    """The existing file written as it is, no temporary file: this process's stdout or stderr through a copy of its
    descriptor (what was printed stays before, even when it is a regular file); a device or FIFO opened as it is."""
    fd = _our_stream(os.stat(path))
    if fd is not None:
        sys.stdout.flush()
        sys.stderr.flush()
    with open(os.dup(fd) if fd is not None else os.open(path, os.O_WRONLY), "wb") as f:
        yield f


@contextmanager
def output_file(path, what: str):
    """A binary file for an output the user named with `what`, written as output_target decides. A failed write
    (ENOSPC, EIO, a closed pipe) is an OutputError (exit 1) naming `what` and the path."""
    target, through = output_target(path, what)
    try:
        with (_writing_through if through else replacing)(target) as f:
            yield f
    except OSError as exc:
        raise OutputError(f"{what} {path}: cannot write: {exc.strerror or exc}") from None


def write_output(path, data: bytes, what: str) -> None:
    with output_file(path, what) as f:
        f.write(data)
