"""`k3 setup`'s memory across runs: `<dest>/.k3-setup.json` (versioned JSON, written atomically) records the
source, the resolved commit, the steps finished and every file's expected size and hash, bytes on disk and
status; `<dest>/.k3-setup.log` keeps a timestamped log. A kill at any moment leaves the last complete state.
One wizard per destination (an flock). Never holds the token. Checked by tests/wizard/test_progress_state.py (the
lock, atomic writes) and tests/wizard/test_steps.py (resuming at the right step).
"""
from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

from k3core import K3Error
from k3core.files.atomic import write_json_atomic
from k3core.files.limits import SMALL_FILE_BYTES, read_json_limited

FORMAT, VERSION = "k3-setup-state", 1
STATE, LOG, LOCK, PARTIAL_DIR = ".k3-setup.json", ".k3-setup.log", ".k3-setup.lock", ".k3-partial"
# file status: pending -> partial -> done (size and hash checked as it arrived) -> verified (re-read from disk)
PENDING, PARTIAL, DONE, VERIFIED = "pending", "partial", "done", "verified"


class StateError(K3Error):
    exit_code = 2


def read_state(dest: Path) -> dict | None:
    """The state file's content (None when there is none); a damaged or foreign one is an error."""
    path = Path(dest) / STATE
    if not path.exists():
        return None
    try:
        data = read_json_limited(path, SMALL_FILE_BYTES, "a setup state file")
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError("not a k3 setup state")
    except (OSError, ValueError) as exc:
        raise StateError(f"{path}: unreadable ({exc}); delete it to start the setup over (finished files are "
                         "re-checked, not downloaded again)") from None
    if data.get("version") != VERSION:
        raise StateError(f"{path}: written by a k3 with state version {data.get('version')}, this one reads "
                         f"{VERSION}; delete it to start the setup over (finished files are re-checked)")
    return data




class SetupState:
    """The open state of one destination (thread-safe; every change is saved before it returns)."""

    def __init__(self, dest: Path, data: dict, lock_fd: int):
        self.dest, self.data, self._lock_fd, self._mutex = dest, data, lock_fd, threading.RLock()

    @classmethod
    def open(cls, dest: Path, identity: dict) -> "SetupState":
        """Lock `dest`, load its state or start one; a state for another source/options is refused."""
        fd = os.open(dest / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateError(f"{dest}: another `k3 setup` is working in this directory") from None
        try:
            data = read_state(dest)
        except StateError:
            os.close(fd)
            raise
        if data is None:
            data = {"format": FORMAT, "version": VERSION, **identity, "steps": {}, "files": {}, "facts": {}}
        else:
            diffs = [f"{k} {data.get(k)!r} (now {v!r})" for k, v in identity.items() if data.get(k) != v]
            if diffs:
                os.close(fd)
                raise StateError(f"{dest} holds a setup started with {', '.join(diffs)}: run the same command as "
                                 f"before to resume it, choose another --dest, or delete {dest / STATE} to start "
                                 "over (files already there are re-checked, not downloaded again)")
        for stale in dest.glob(f".{STATE}.*.tmp"):     # left by a kill in the middle of a save
            stale.unlink(missing_ok=True)
        state = cls(dest, data, fd)
        state.save()
        return state

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def save(self) -> None:
        with self._mutex:
            write_json_atomic(self.dest / STATE, self.data)

    def log(self, message: str) -> None:
        with self._mutex, open(self.dest / LOG, "a") as f:
            f.write(time.strftime("%Y-%m-%d %H:%M:%S ") + message.replace("\n", "\n    ") + "\n")

    # ---- steps --------------------------------------------------------------------------------
    def step(self, name: str, key=None) -> dict | None:
        """The record of a finished step (None if not finished, or finished with another key)."""
        rec = self.data["steps"].get(name)
        return rec if rec is not None and rec.get("key") == key else None

    def finish(self, name: str, result: str, key=None) -> None:
        with self._mutex:
            self.data["steps"][name] = {"result": result, "key": key, "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
            self.save()
        self.log(f"step {name} done: {result}")

    def reopen(self, *names: str) -> None:
        with self._mutex:
            for name in names:
                self.data["steps"].pop(name, None)
            self.save()

    # ---- facts and files ----------------------------------------------------------------------
    @property
    def facts(self) -> dict:
        return self.data["facts"]

    def set_facts(self, **facts) -> None:
        with self._mutex:
            self.data["facts"].update(facts)
            self.save()

    @property
    def files(self) -> dict:
        return self.data["files"]

    def set_files(self, files: dict) -> None:
        with self._mutex:
            self.data["files"] = files
            self.save()

    def update_file(self, local: str, **fields) -> None:
        with self._mutex:
            self.data["files"][local].update(fields)
            self.save()
