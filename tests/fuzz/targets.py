"""What each fuzz target feeds its input to, and the one property: it either works or raises a K3Error (an
error naming what is wrong, with an exit code). Shared by the hypothesis tests and the corpus replay."""
from __future__ import annotations

import tempfile
from pathlib import Path

from k3core import K3Error
from k3core.format import header_scan as scan
from k3core.format import safetensors_index as si
from k3core.format.safetensors_index import ShardIndex
from k3core.format.config import load_config
from k3core.text.tokenizer import load_tokenizer


def header(raw: bytes) -> None:
    """A shard whose header is `raw`: the compact parser and the json parser agree, and opening it is clean."""
    buf = bytearray(raw + bytes(64))
    try:
        fast = scan.parse_compact(buf, len(raw))
    except K3Error:
        fast = "refused"
    try:
        slow = si._parse_json(memoryview(bytearray(raw)), "fuzz.safetensors")
    except K3Error:
        slow = "refused"
    if fast not in (None, "refused"):  # what the fast path accepts, the reference path reads the same way
        assert slow != "refused", "the compact parser accepted a header json.loads refuses"
        cols = lambda t: ([t.name(i) for i in range(len(t.start))], [t.kinds[k] for k in t.kind],  # noqa: E731
                          t.begin.tolist(), t.end.tolist())
        assert cols(fast) == cols(slow)
    if fast == "refused":
        assert slow == "refused", "the compact parser refused a header json.loads reads"
    with tempfile.TemporaryDirectory() as d:
        Path(d, "a.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(256))
        try:
            ShardIndex.open(d).close()
        except K3Error:
            pass


def config(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        Path(d, "config.json").write_bytes(raw)
        try:
            load_config(d)
        except K3Error:
            pass


def tokenizer(files: dict[str, bytes]) -> None:
    """A tokenizer directory from these files: it loads and round-trips text, or is a TokenizerError."""
    with tempfile.TemporaryDirectory() as d:
        for name, data in files.items():
            Path(d, name).write_bytes(data)
        try:
            tok = load_tokenizer(d)
        except K3Error:
            return
        text = "Hello, world! 12 345 naïve 北京 \n\t end"
        assert tok.decode(tok.encode(text)) == text


def state_file(raw: bytes, engine) -> None:
    from k3core.model.state_file import load_state

    with tempfile.TemporaryDirectory() as d:
        Path(d, "s.npz").write_bytes(raw)
        try:
            load_state(Path(d, "s.npz"), engine)
        except K3Error:
            pass


def chat(messages, tokenizer_, mode: str) -> None:
    from k3core.text.chat import render

    try:
        render(messages, tokenizer_, mode)
    except K3Error:
        pass
