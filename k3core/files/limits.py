"""Bounded input: a file k3 reads whole is read through `read_limited`, which reads one byte past its limit
and no further (so a pipe or a device such as /dev/zero is refused as fast as a large file: st_size says
nothing about them), and a JSON text is parsed through `loads_limited`, which measures its nesting before
json.loads could recurse past the stack. Both raise LimitError (exit 2) naming the input and the limit; the
limits are listed in docs/LIMITS.md. Checked by tests/faults/test_bounds.py.
"""
from __future__ import annotations

import json

import numpy as np

from ..errors import K3Error

MAX_JSON_DEPTH = 128            # [ and { levels: an OpenAI tool schema nests ~30 deep, k3's own files under 10
SMALL_FILE_BYTES = 16 << 20     # config.json, tokenizer files, the profile, a state file's metadata, setup state
INDEX_FILE_BYTES = 256 << 20    # model.safetensors.index.json, a packed trunk's manifest.json (~60 MB for K3's index)


class LimitError(K3Error):
    """An input past one of k3's documented limits (bytes of a file, nesting of a JSON text)."""

    exit_code = 2


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n:,} bytes"


def read_limited(path, limit: int, what: str) -> bytes:
    """All of `path` -- a file, a pipe or a device -- if it holds at most `limit` bytes. At most limit + 1
    bytes are read; more than `limit` is a LimitError naming the file, `what` it is and the limit."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise too_large(path, limit, what)
    return data


def too_large(source, limit: int, what: str) -> LimitError:
    """The error for `source` holding more than `limit` bytes, the limit of `what`."""
    return LimitError(f"{source}: more than {_size(limit)}, the limit of {what}")


_STEP = np.zeros(256, np.int8)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1


def _unescaped(a, quotes):
    """The quote positions not escaped, i.e. not preceded by an odd run of backslashes."""
    slashes = np.flatnonzero(a == ord("\\"))
    if not len(slashes):
        return quotes
    run_start = np.maximum.accumulate(np.where(np.diff(slashes, prepend=-2) != 1, slashes, 0))
    last = np.maximum(np.searchsorted(slashes, quotes) - 1, 0)        # the last backslash before each quote
    run = np.where(slashes[last] == quotes - 1, quotes - run_start[last], 0)
    return quotes[run % 2 == 0]


def nesting_depth(text: str | bytes) -> int:
    """The deepest nesting of [ and { outside strings in a JSON text (or a prefix of one), as json.loads
    would recurse into it; bytes must be UTF-8 (no byte of a multi-byte character is ASCII)."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    a = np.frombuffer(raw, np.uint8)
    quotes = _unescaped(a, np.flatnonzero(a == ord('"')))
    step = _STEP[a]
    brackets = np.flatnonzero(step)
    outside = np.searchsorted(quotes, brackets) % 2 == 0   # an even number of quotes before it
    return int(np.cumsum(step[brackets[outside]], dtype=np.int64).max(initial=0))


def loads_limited(text: str | bytes, source, **kw):
    """json.loads(text, **kw), after refusing (LimitError naming `source`) a text nested deeper than
    MAX_JSON_DEPTH. Bytes are decoded as json.loads decodes them (UTF-8, -16 or -32)."""
    if not isinstance(text, str):
        text = bytes(text).decode(json.detect_encoding(text), "surrogatepass")
    if (depth := nesting_depth(text)) > MAX_JSON_DEPTH:
        raise LimitError(f"{source}: JSON nested {depth} levels deep, past the limit of {MAX_JSON_DEPTH}")
    return json.loads(text, **kw)


def read_json_limited(path, limit: int, what: str, **kw):
    """read_limited, then loads_limited: `path` parsed, or a LimitError naming it."""
    return loads_limited(read_limited(path, limit, what), path, **kw)
