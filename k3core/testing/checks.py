"""What a conformance check is and how it reports: a named callable that raises CheckFailed (or any
exception) when the plugin breaks its contract, run by `run_checks` into pass/fail results."""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from typing import Callable


class CheckFailed(AssertionError):
    """A plugin broke its contract; the message says where."""


@dataclass(frozen=True)
class Check:
    """One check of one plugin. Call it (pytest: parametrize over a list of them) to run it."""

    name: str        # e.g. "expert store 'twoq': serves each expert's own bytes"
    run: Callable[[], None]

    def __call__(self) -> None:
        self.run()

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Result:
    name: str
    passed: bool
    detail: str
    seconds: float


def run_checks(checks) -> list[Result]:
    """Run every check; an exception is a failure whose detail is its message (the traceback's last
    frame for anything but CheckFailed), never an escape."""
    results = []
    for check in checks:
        start = time.perf_counter()
        try:
            check()
            results.append(Result(check.name, True, "", time.perf_counter() - start))
        except CheckFailed as exc:
            results.append(Result(check.name, False, str(exc), time.perf_counter() - start))
        except Exception as exc:  # noqa: BLE001 - a plugin's crash is a failed check, reported
            where = traceback.extract_tb(exc.__traceback__)[-1]
            detail = f"{type(exc).__name__}: {exc} (at {where.filename}:{where.lineno})"
            results.append(Result(check.name, False, detail, time.perf_counter() - start))
    return results


def expect(ok: bool, message: str) -> None:
    if not ok:
        raise CheckFailed(message)
