"""Ctrl-C in the `k3` process, at any moment: one line, "k3: interrupted", and exit 130, never a traceback.

While k3core.cli.main imports and once main() has its exit code, Ctrl-C exits at once (exit_now); while a command
runs it is KeyboardInterrupt, so `finally` blocks run, and main() turns it into 130. Not covered: the ~25 ms before
Python runs k3's first line (its own start-up). Checked by tests/faults/test_interrupt.py on real processes.
"""
import _signal  # not `signal`: it imports enum, ~5 ms more before the handler is in place
import _thread
import atexit
import os
import sys
import time

LINE = "k3: interrupted"
EXIT_CODE = 130


def exit_now(signum=None, frame=None) -> None:
    """The SIGINT handler where nothing is left to clean up: what stdout holds goes out, then the line, exit 130."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError, RuntimeError):  # a closed pipe, a closed stream, or Ctrl-C inside stdout's own write
        pass
    os.write(2, f"{LINE}\n".encode())
    os._exit(EXIT_CODE)


def exit_at_once():
    """Make Ctrl-C exit at once (exit_now), unless a host program or test runner installed a handler of its own;
    returns the handler it replaced, for restore()."""
    before = _signal.getsignal(_signal.SIGINT)
    if before is _signal.default_int_handler:
        _signal.signal(_signal.SIGINT, exit_now)
    return before


def restore(before) -> None:
    """Undo exit_at_once(): Ctrl-C is KeyboardInterrupt again."""
    if _signal.getsignal(_signal.SIGINT) is exit_now:
        _signal.signal(_signal.SIGINT, before)


def redeliver_dropped(unraisable) -> None:
    """sys.unraisablehook for the process. A Ctrl-C that landed in a weakref callback or a __del__ (an import's module
    lock, a closing file), where Python would print a traceback and drop it, is sent again a millisecond later, once
    this hook has returned, to land in the command's own code; one that lands in this hook exits at once. Anything
    else is reported as Python reports it."""
    try:
        if issubclass(unraisable.exc_type, KeyboardInterrupt):
            _thread.start_new_thread(_send_sigint_soon, (_thread.get_ident(),))
        else:
            sys.__unraisablehook__(unraisable)
    except KeyboardInterrupt:
        exit_now()


def _send_sigint_soon(thread_id: int) -> None:
    time.sleep(0.001)  # the hook has returned by then
    _signal.pthread_kill(thread_id, _signal.SIGINT)  # a real signal: it also ends a blocking call of that thread


def exit_at_once_until_the_end() -> None:
    """For the rest of the process: Ctrl-C exits at once while Python code still runs (waiting for threads), and is
    ignored from the atexit stage on, where Python would put SIGINT back to the system default and a Ctrl-C would
    kill the process without the line (atexit runs its last registration first)."""
    exit_at_once()
    atexit.register(_signal.signal, _signal.SIGINT, _signal.SIG_IGN)
