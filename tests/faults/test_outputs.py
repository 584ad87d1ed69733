"""Outputs a user names never replace what they should not: `k3 run --json / --dump-logits / --dump-trace` and chat's
`/save` replace a regular file (or make a new one) atomically, through a symlink the link survives, a device or FIFO
is written through, a directory is exit 2 naming the flag and the path, and no temporary file stays on any failure.
Devices are only ever reached through a symlink in tmp_path, so no row can damage /dev even when the rule is broken."""
from __future__ import annotations

import json
import os
import resource
import stat
import subprocess
import sys

import numpy as np
import pytest

from k3core.cli.main import main
from k3core.errors import K3Error

RUN = ["--ids", "1,2", "--gen", "3", "--quiet"]
LOGITS_BYTES = 3 * 256 * 4  # --gen 3 on the tiny model (vocabulary 256), float32


def row(case, *values, full=False):
    return pytest.param(*values, id=case, marks=[pytest.mark.faults_full] if full else [])


def temporaries(root):
    return sorted(str(p) for p in root.rglob("*.tmp"))


def file(t, name, text="old"):
    (t / name).write_text(text)
    return t / name


def directory(t, name):
    (t / name).mkdir()
    return t / name


def link(t, name, to):
    os.symlink(to, t / name)
    return t / name


def witnessed(t, name):
    """A file with a hard link "witness" to it: after an atomic replace the witness still holds the old bytes."""
    os.link(file(t, name), t / "witness")
    return t / name


def replaced(t):
    return (t / "witness").read_text() == "old"


def still_full(t):
    return os.readlink(t / "full") == "/dev/full" and stat.S_ISCHR(os.stat("/dev/full").st_mode)


def report_in(path):
    return json.loads(path.read_text())["generated_ids"]


def trace_dir_with_json_to_full(t):
    link(directory(t, "tr"), "trace.json", "/dev/full")
    return t / "tr"


# (flag, setup(tmp_path) -> the path given, exit code, needle in stderr ({path} filled in), check(tmp_path))
RUN_CASES = [
    row("json-a-directory", "--json", lambda t: directory(t, "d"), 2, "--json {path}: is a directory",
        lambda t: not any((t / "d").iterdir())),
    row("json-symlink-to-a-file", "--json", lambda t: witnessed(t, "real.json") and link(t, "l", "real.json"), 0, "",
        lambda t: os.readlink(t / "l") == "real.json" and report_in(t / "real.json") and replaced(t)),
    row("json-symlink-to-/dev/full", "--json", lambda t: link(t, "full", "/dev/full"), 1,
        "--json {path}: cannot write: No space left on device", still_full),
    row("dump-logits-symlink-to-/dev/full", "--dump-logits", lambda t: link(t, "full", "/dev/full"), 1,
        "--dump-logits {path}: cannot write: No space left on device", still_full),
    row("dump-trace-a-file", "--dump-trace", lambda t: file(t, "f"), 2, "--dump-trace {path}: not a directory",
        lambda t: (t / "f").read_text() == "old"),
    row("json-dangling-symlink", "--json", lambda t: link(t, "l", "later.json"), 0, "",
        lambda t: os.readlink(t / "l") == "later.json" and report_in(t / "later.json"), full=True),
    row("dump-logits-a-directory", "--dump-logits", lambda t: directory(t, "d"), 2,
        "--dump-logits {path}: is a directory", lambda t: not any((t / "d").iterdir()), full=True),
    row("dump-trace-file-symlink-to-/dev/full", "--dump-trace", trace_dir_with_json_to_full, 1,
        "--dump-trace {path}/trace.json: cannot write",
        lambda t: os.readlink(t / "tr" / "trace.json") == "/dev/full", full=True),
]


@pytest.mark.parametrize("flag, setup, code, needle, check", RUN_CASES)
def test_run_output(capsys, tiny_model, tmp_path, flag, setup, code, needle, check):
    path = setup(tmp_path)
    got = main(["run", str(tiny_model), *RUN, flag, str(path)])
    err = capsys.readouterr().err
    assert got == code, err
    assert needle.format(path=path) in err and "Traceback" not in err
    assert check(tmp_path), os.listdir(tmp_path)
    assert temporaries(tmp_path) == []


def test_dump_logits_into_a_fifo_is_written_through(capsys, tiny_model, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader is there, so the writer's open does not wait
    try:
        assert main(["run", str(tiny_model), *RUN, "--dump-logits", str(fifo)]) == 0, capsys.readouterr().err
        got = os.read(reader, 1 << 16)
    finally:
        os.close(reader)
    assert len(got) == LOGITS_BYTES and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert temporaries(tmp_path) == []


def k3(*argv, **kw):
    return subprocess.run([sys.executable, "-m", "k3core", *map(str, argv)], capture_output=True, text=True, **kw)


def test_json_through_a_symlink_to_stdout_reaches_stdout(tiny_model, tmp_path):
    out = link(tmp_path, "out", "/proc/self/fd/1")
    done = k3("run", tiny_model, *RUN, "--json", out)
    assert done.returncode == 0, done.stderr
    ids, report = done.stdout.split("\n", 1)
    assert json.loads(report)["generated_ids"] == [int(t) for t in ids.split()]
    assert os.readlink(out) == "/proc/self/fd/1" and temporaries(tmp_path) == []


def _file_size_limit(limit):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def test_a_write_error_mid_write_leaves_the_old_file_and_no_temporary(tiny_model, tmp_path):
    """The disk fills up half-way through the logits (RLIMIT_FSIZE: EFBIG after 1000 bytes)."""
    target = tmp_path / "logits.f32"
    target.write_bytes(b"old")
    done = k3("run", tiny_model, *RUN, "--dump-logits", target, preexec_fn=_file_size_limit(1000))
    assert done.returncode == 1 and f"--dump-logits {target}: cannot write: File too large" in done.stderr
    assert "Traceback" not in done.stderr and target.read_bytes() == b"old" and temporaries(tmp_path) == []


@pytest.fixture(scope="module")
def chat(tiny_model):
    from k3core import ChatSession, EngineConfig, load_tokenizer, open_engine

    with open_engine(EngineConfig(tiny_model)) as engine:
        yield ChatSession(engine, load_tokenizer(tiny_model)), engine


def save(chat, path) -> None:
    from k3core.cli.chat import _command

    _command(f"/save {path}", *chat)


def boom_half_way(file, **arrays):
    file.write(b"PK\x03\x04 half a state file")
    raise KeyboardInterrupt  # Ctrl-C (or any exception) in the middle of the write


# (setup(tmp_path) -> the path given, exit code of the error (None: saved), its message ({path} filled in), check)
SAVE_CASES = [
    row("a-directory", lambda t: directory(t, "d"), 2, "/save {path}: is a directory",
        lambda t: not any((t / "d").iterdir())),
    row("symlink-to-/dev/full", lambda t: link(t, "full", "/dev/full"), 1,
        "/save {path}: cannot write: No space left on device", still_full),
    row("symlink-to-a-file", lambda t: witnessed(t, "s.npz") and link(t, "l", "s.npz"), None, "",
        lambda t: os.readlink(t / "l") == "s.npz" and np.load(t / "s.npz")["ids"].ndim == 1 and replaced(t)),
    row("missing-directory", lambda t: t / "nowhere" / "s.npz", 2, "/save {path}: its directory does not exist",
        lambda t: not (t / "nowhere").exists(), full=True),
]


@pytest.mark.parametrize("setup, code, message, check", SAVE_CASES)
def test_chat_save(chat, tmp_path, setup, code, message, check):
    path = setup(tmp_path)
    if code is None:
        save(chat, path)
    else:
        with pytest.raises(K3Error) as raised:
            save(chat, path)
        assert raised.value.exit_code == code and message.format(path=path) in str(raised.value)
    assert check(tmp_path) and temporaries(tmp_path) == []


def test_an_exception_mid_save_leaves_the_old_file_and_no_temporary(chat, tmp_path, monkeypatch):
    target = tmp_path / "s.npz"
    target.write_bytes(b"old")
    monkeypatch.setattr(np, "savez", boom_half_way)
    with pytest.raises(KeyboardInterrupt):
        save(chat, target)
    assert target.read_bytes() == b"old" and temporaries(tmp_path) == []
