"""Outputs a user names never replace what they should not: `k3 run --json / --dump-logits / --dump-trace` and chat's
`/save` replace a regular file (or make a new one) atomically, keeping its mode and owner; through a symlink the link
survives, a device or FIFO is written through (a FIFO without a reader is refused before the run, not waited on), a
directory, a read-only directory or two outputs that are one file are exit 2 naming the flags and the paths, a failed
write (a full disk) is exit 2 naming the flag, the path and why, and no temporary file stays on any failure. Standard
output is an output too: closed or full, exit 2 naming it. Devices are only ever reached through a symlink in tmp_path
(or as the stdout of a child process), so no row can damage /dev even when the rule is broken."""
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
LOUD = RUN[:-1]  # without --quiet the memory plan is printed as the model loads: its absence shows a refusal came first
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


def private(t, name, mode=0o600):
    os.chmod(file(t, name), mode)
    return t / name


def kept(t, name, mode):
    st = os.stat(t / name)
    return stat.S_IMODE(st.st_mode) == mode and report_in(t / name)


# (flag, setup(tmp_path) -> the path given, exit code, needle in stderr ({path} filled in), check(tmp_path))
RUN_CASES = [
    row("json-a-directory", "--json", lambda t: directory(t, "d"), 2, "--json {path}: is a directory",
        lambda t: not any((t / "d").iterdir())),
    row("json-symlink-to-a-file", "--json", lambda t: witnessed(t, "real.json") and link(t, "l", "real.json"), 0, "",
        lambda t: os.readlink(t / "l") == "real.json" and report_in(t / "real.json") and replaced(t)),
    row("json-symlink-to-/dev/full", "--json", lambda t: link(t, "full", "/dev/full"), 2,
        "--json {path}: cannot write: No space left on device", still_full),
    row("dump-logits-symlink-to-/dev/full", "--dump-logits", lambda t: link(t, "full", "/dev/full"), 2,
        "--dump-logits {path}: cannot write: No space left on device", still_full),
    row("dump-trace-a-file", "--dump-trace", lambda t: file(t, "f"), 2, "--dump-trace {path}: not a directory",
        lambda t: (t / "f").read_text() == "old"),
    row("json-over-a-0600-file", "--json", lambda t: private(t, "r.json"), 0, "", lambda t: kept(t, "r.json", 0o600)),
    row("dump-logits-over-a-0640-file", "--dump-logits", lambda t: private(t, "l.f32", 0o640), 0, "",
        lambda t: stat.S_IMODE(os.stat(t / "l.f32").st_mode) == 0o640, full=True),
    row("json-dangling-symlink", "--json", lambda t: link(t, "l", "later.json"), 0, "",
        lambda t: os.readlink(t / "l") == "later.json" and report_in(t / "later.json"), full=True),
    row("dump-logits-a-directory", "--dump-logits", lambda t: directory(t, "d"), 2,
        "--dump-logits {path}: is a directory", lambda t: not any((t / "d").iterdir()), full=True),
    row("dump-trace-file-symlink-to-/dev/full", "--dump-trace", trace_dir_with_json_to_full, 2,
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
    assert done.returncode == 2 and f"--dump-logits {target}: cannot write: File too large" in done.stderr
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
    row("symlink-to-/dev/full", lambda t: link(t, "full", "/dev/full"), 2,
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


def one_path(t):
    return ["--json", t / "x", "--dump-logits", t / "x"]


def through_a_symlink(t):
    return ["--json", file(t, "x"), "--dump-logits", link(t, "y", "x")]


def a_hard_link(t):
    os.link(file(t, "x"), t / "y")
    return ["--json", t / "x", "--dump-logits", t / "y"]


def dot_slash(t):
    return ["--json", "x", "--dump-logits", "./x"]  # run in tmp_path


def inside_the_trace(t):
    return ["--json", directory(t, "tr") / "trace.json", "--dump-trace", t / "tr"]


def devices(t):
    return ["--json", link(t, "n1", "/dev/null"), "--dump-logits", link(t, "n2", "/dev/null")]


# (setup(tmp_path) -> the output flags, exit code, needle ({t}: tmp_path)); a refused run writes nothing
SAME_FILE_CASES = [
    row("json-and-dump-logits-one-path", one_path, 2, "--json {t}/x and --dump-logits {t}/x are one file"),
    row("one-file-through-a-symlink", through_a_symlink, 2, "--json {t}/x and --dump-logits {t}/y are one file"),
    row("one-file-by-a-hard-link", a_hard_link, 2, "--json {t}/x and --dump-logits {t}/y are one file"),
    row("one-file-as-./x", dot_slash, 2, "--json x and --dump-logits ./x are one file", full=True),
    row("json-onto-the-trace's-own-file", inside_the_trace, 2,
        "--json {t}/tr/trace.json and --dump-trace {t}/tr (its trace.json) are one file", full=True),
    row("two-outputs-to-/dev/null-may-share-it", devices, 0, "", full=True),
]


@pytest.mark.parametrize("setup, code, needle", SAME_FILE_CASES)
def test_two_outputs_that_are_one_file(capsys, tiny_model, tmp_path, monkeypatch, setup, code, needle):
    monkeypatch.chdir(tmp_path)
    flags = setup(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()}
    got = main(["run", str(tiny_model), *LOUD, *map(str, flags)])
    err = capsys.readouterr().err
    assert got == code and needle.format(t=tmp_path) in err and "Traceback" not in err, err
    if code:
        after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()}
        assert after == before and "memory plan" not in err  # refused before anything loads


def read_only(monkeypatch, root):
    """Everything under `root` behaves as on a read-only file system for the up-front check (os.access says no,
    statvfs says ST_RDONLY): no container lets a test mount one."""
    access, statvfs = os.access, os.statvfs
    under = lambda p: os.path.abspath(p).startswith(str(root))  # noqa: E731

    def fake_statvfs(p):
        got = statvfs(p)
        return type("Vfs", (), {"f_flag": got.f_flag | (os.ST_RDONLY if under(p) else 0)})()

    monkeypatch.setattr(os, "access", lambda p, mode, **kw: not (under(p) and mode & os.W_OK) and access(p, mode, **kw))
    monkeypatch.setattr(os, "statvfs", fake_statvfs)


# (flag, setup(tmp_path) -> the path given, needle ({path}, {t}))
READ_ONLY_CASES = [
    row("dump-trace-new-dir-on-a-read-only-fs", "--dump-trace", lambda t: t / "ro" / "trace",
        "--dump-trace {path}: cannot write there: read-only file system"),
    row("json-new-file-on-a-read-only-fs", "--json", lambda t: t / "ro" / "r.json",
        "--json {path}: cannot write into {t}/ro: read-only file system"),
    row("dump-logits-over-a-file-on-a-read-only-fs", "--dump-logits", lambda t: file(t / "ro", "l.f32"),
        "--dump-logits {path}: cannot write into {t}/ro: read-only file system", full=True),
    row("dump-trace-existing-dir-on-a-read-only-fs", "--dump-trace", lambda t: directory(t / "ro", "trace"),
        "--dump-trace {path}: cannot write there: read-only file system", full=True),
]


@pytest.mark.parametrize("flag, setup, needle", READ_ONLY_CASES)
def test_an_output_on_a_read_only_file_system(capsys, tiny_model, tmp_path, monkeypatch, flag, setup, needle):
    (tmp_path / "ro").mkdir()
    path = setup(tmp_path)
    read_only(monkeypatch, tmp_path / "ro")
    got = main(["run", str(tiny_model), *LOUD, flag, str(path)])
    err = capsys.readouterr().err
    assert got == 2 and needle.format(path=path, t=tmp_path) in err and "memory plan" not in err, err


def test_a_trace_directory_that_cannot_be_made_at_the_end_is_exit_2(capsys, tiny_model, tmp_path, monkeypatch):
    """The file system turns read-only during the run: the directory of --dump-trace cannot be made."""
    from pathlib import Path

    def erofs(self, *a, **kw):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(Path, "mkdir", erofs)
    got = main(["run", str(tiny_model), *RUN, "--dump-trace", str(tmp_path / "tr")])
    err = capsys.readouterr().err
    assert got == 2 and f"--dump-trace {tmp_path / 'tr'}: cannot make the directory: Read-only file system" in err, err


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may give a file to another user")
def test_an_atomic_replace_keeps_the_owner(capsys, tiny_model, tmp_path):
    os.chown(private(tmp_path, "r.json"), 65534, 65534)
    assert main(["run", str(tiny_model), *RUN, "--json", str(tmp_path / "r.json")]) == 0, capsys.readouterr().err
    st = os.stat(tmp_path / "r.json")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (65534, 65534, 0o600) and report_in(tmp_path / "r.json")


def test_json_into_a_fifo_without_a_reader_is_refused_not_waited_on(tiny_model, tmp_path):
    """No reader: exit 2 before the model loads (a child with a deadline, so a hang fails the row, not the run)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = k3("run", tiny_model, *LOUD, "--json", fifo, timeout=120)
    assert done.returncode == 2 and f"--json {fifo}: a FIFO with no reader" in done.stderr, done.stderr
    assert "memory plan" not in done.stderr and done.stdout == "" and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def _closed_stdout():
    os.close(1)


# (how the child's stdout is set up: Popen keyword arguments, exit code, needle)
STDOUT_CASES = [
    row("stdout-closed", lambda: {"preexec_fn": _closed_stdout}, 2,
        "standard output (stdout) is closed, and the generation is written there"),
    row("stdout-/dev/full", lambda: {"stdout": open("/dev/full", "wb")}, 2,
        "standard output (stdout): cannot write the generation: No space left on device"),
    row("stdout-open-only-for-reading", lambda: {"stdout": open(os.devnull, "rb")}, 2,
        "standard output (stdout) is open only for reading", full=True),
]


@pytest.mark.parametrize("setup, code, needle", STDOUT_CASES)
def test_standard_output_that_cannot_be_written(tiny_model, setup, code, needle):
    kw = setup()
    out = kw.pop("stdout", subprocess.PIPE)
    try:
        done = subprocess.run([sys.executable, "-m", "k3core", "run", str(tiny_model), *RUN], stdout=out,
                              stderr=subprocess.PIPE, text=True, timeout=120, **kw)
    finally:
        if out is not subprocess.PIPE:
            out.close()
    assert done.returncode == code and needle in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
