"""`--log-level` for the long-running commands (`k3 ui`, `k3 setup`): stdlib logging to stderr, one line
per event with time, level and source ("k3.ui", "k3.setup", …). Secrets never reach a log line: the
callers log counts, names and outcomes, not tokens, passwords or message text."""
from __future__ import annotations

import logging
import sys

LEVELS = ("debug", "info", "warning", "error")



def configure_logging(level: str = "warning") -> None:
    """Log records of `level` and up to stderr (replacing any earlier configuration of the root logger)."""
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    logging.basicConfig(level=getattr(logging, level.upper()), stream=sys.stderr, force=True,
                        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s", datefmt="%Y-%m-%d %H:%M:%S")
