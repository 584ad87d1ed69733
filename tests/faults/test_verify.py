"""`k3 verify` against changed weight files, and `k3 make-model` against a full disk. A verify row changes one
thing in a copy of the tiny model, runs `k3 verify`, and asserts the exit code, the line naming the file (and
tensor or field), and that nothing was lost: the recorded checksums (k3-tensor-sums.bin) and every shard are the
bytes they were, and a run still refuses the changed weights (verify never blesses them). Recording over a
record the bytes fail is `k3 verify --record` alone, which names what it replaces."""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys

import pytest

from k3core.cli.main import main
from k3core.format.checkpoint import expert_prefix, layer_prefix, open_checkpoint

SUMS = "k3-tensor-sums.bin"
Q = layer_prefix(1) + "self_attn.q_proj.weight"
E0, E1 = (expert_prefix(2, e) + "w1.weight_packed" for e in (0, 1))
SHARD = "model-00002-of-000015.safetensors"  # layer 1's: the test model writes a shard per layer


def row(case, *values, full=False):
    return pytest.param(*values, id=case, marks=[pytest.mark.faults_full] if full else [])


def info(model, name):
    ckpt = open_checkpoint(model)
    try:
        return ckpt.index[name]
    finally:
        ckpt.close()


def flip(model, name=Q):
    t = info(model, name)
    with open(t.file, "r+b") as f:
        f.seek(t.offset + t.nbytes // 2)
        byte = f.read(1)[0]
        f.seek(t.offset + t.nbytes // 2)
        f.write(bytes([byte ^ 0x01]))
    return t.file.name


def swap_experts(model):
    a, b = info(model, E0), info(model, E1)
    with open(a.file, "r+b") as f:
        f.seek(a.offset)
        x = f.read(a.nbytes)
        f.seek(b.offset)
        y = f.read(b.nbytes)
        f.seek(a.offset)
        f.write(y)
        f.seek(b.offset)
        f.write(x)
    return a.file.name


def header_edit(model, old: bytes, new: bytes):
    """Shard SHARD's header with `old` replaced by `new` (space padded to the same length)."""
    path = model / SHARD
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    head = data[8:8 + n].replace(old, new, 1)
    path.write_bytes(data[:8] + head + b" " * (n - len(head)) + data[8 + n:])


def replace_shard(model, make):
    (model / SHARD).unlink()
    make(model / SHARD)


def loop(path):
    os.symlink(path.name + ".b", path.with_name(path.name + ".a"))
    os.symlink(path.name + ".a", path.with_name(path.name + ".b"))
    os.symlink(path.name + ".a", path)


def run_code(model):
    return main(["run", str(model), "--ids", "0,1,2", "--gen", "3", "--quiet"])


# (change(model), exit code, needle in stdout, what a run then does: exit code, or None for no run)
VERIFY_CASES = [
    row("bit-flipped-in-q_proj", lambda m: flip(m), 2,
        f"BAD  {SHARD}: 1 tensor(s) differ from their checksums recorded in {SUMS}: {Q}", 4),
    row("two-experts-bytes-swapped", swap_experts, 2, f"2 tensor(s) differ from their checksums recorded in {SUMS}: "
        f"{E0}, {E1}", 4),
    row("checksum-file-damaged", lambda m: (m / SUMS).write_bytes(b"garbage"), 2,
        f"BAD  {SUMS}: unreadable: not a k3 tensor checksum file, so it vouches for no shard", 2),
    row("shard-header-changed", lambda m: header_edit(m, b'"pt"', b'"Pt"'), 2,
        f"BAD  {SHARD}: its header changed since its checksums were recorded", 2),
    row("metadata-a-list", lambda m: header_edit(m, b'{"format":"pt"}', b"[1]"), 2,
        f'field "__metadata__" is [1]: the safetensors format allows only an object of string -> string there '
        f"(file {{model}}/{SHARD})", None),
    row("metadata-value-a-number", lambda m: header_edit(m, b'{"format":"pt"}', b'{"format":1}'), 2,
        'field "__metadata__" is {{"format": 1}}', None),
    row("shard-a-fifo", lambda m: replace_shard(m, os.mkfifo), 2, f"BAD  {SHARD}: a FIFO, not a regular file", None),
    row("shard-a-symlink-loop", lambda m: replace_shard(m, loop), 2, f"BAD  {SHARD}: a symlink loop", None),
    row("shard-a-dangling-symlink", lambda m: replace_shard(m, lambda p: os.symlink("nowhere", p)), 2,
        f"BAD  {SHARD}: a symlink to nowhere, which does not exist", None),
]


def snapshot(model):
    """Every regular file's bytes, by name (a FIFO or a link is named, never opened)."""
    return {p.name: p.read_bytes() if p.is_file() and not p.is_symlink() else os.path.islink(p)
            for p in sorted(model.iterdir())}


def verify(model, *flags):
    """`k3 verify` in a process of its own, so a hang (a FIFO opened for reading) fails the row instead of the
    suite; (exit code, stdout, stderr)."""
    done = subprocess.run([sys.executable, "-m", "k3core", "verify", str(model), *flags], capture_output=True,
                          text=True, timeout=120)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("change, code, needle, run_after", VERIFY_CASES)
def test_verify_names_what_changed_and_records_nothing_over_it(tiny_model, tmp_path, change, code, needle,
                                                               run_after):
    model = shutil.copytree(tiny_model, tmp_path / "m")
    change(model)
    before = snapshot(model)
    rc, out, err = verify(model)
    assert rc == code, out + err
    assert needle.format(model=model) in out + err, out + err
    assert "Traceback" not in err and "runtime failure" not in err
    assert snapshot(model) == before  # nothing recorded over the record, no shard touched
    if run_after is not None:
        assert run_code(model) == run_after


def test_verify_says_how_to_restore_the_shard_and_how_to_record_on_purpose(tiny_model, tmp_path):
    model = shutil.copytree(tiny_model, tmp_path / "m")
    flip(model)
    rc, out, _ = verify(model)
    assert rc == 2
    assert f"the tensor checksums in {SUMS} are kept; restore {SHARD} from where the checkpoint came from" in out
    assert f"`k3 verify {model} --record` records every tensor's checksum again, trusting the bytes on disk" in out


def test_the_run_advice_names_verify_as_it_now_behaves(tiny_model, tmp_path, capsys):
    model = shutil.copytree(tiny_model, tmp_path / "m")
    flip(model)
    assert run_code(model) == 4
    assert f"`k3 verify {model}` names every shard that changed, to restore it" in capsys.readouterr().err


def test_record_is_explicit_and_names_what_it_replaces(tiny_model, tmp_path):
    model = shutil.copytree(tiny_model, tmp_path / "m")
    flip(model)
    rc, out, err = verify(model, "--record")
    assert rc == 0, out + err
    assert f"RECORDED {SHARD}: 1 tensor(s) differ from their checksums recorded in {SUMS}: {Q}; recorded again " \
           "from the bytes on disk, as --record asks" in out
    assert "trusting the bytes on disk of 15 shard(s) that no hash from the Hub proves (--record)" in out
    assert run_code(model) == 0
    rc, out, _ = verify(model)
    assert rc == 0 and f"every tensor matches its checksum recorded in {SUMS}" in out


def test_record_refuses_bytes_something_else_shows_wrong(tiny_model, tmp_path):
    model = shutil.copytree(tiny_model, tmp_path / "m")
    flip(model)
    config = json.loads((model / "config.json").read_text())
    config["text_config"]["num_experts"] = 9
    (model / "config.json").write_text(json.dumps(config))
    before = snapshot(model)
    rc, out, _ = verify(model, "--record")
    assert rc == 2 and "BAD  (checkpoint)" in out and "nothing recorded: --record trusts the bytes on disk only" in out
    assert snapshot(model) == before


def test_without_a_record_verify_says_it_trusts_the_bytes_on_disk(tiny_model, tmp_path):
    model = shutil.copytree(tiny_model, tmp_path / "m")
    (model / SUMS).unlink()
    rc, out, _ = verify(model)
    assert rc == 0 and "no tensor checksums were recorded here: every tensor's checksum recorded, trusting the " \
        "bytes on disk of 15 shard(s)" in out
    assert (model / SUMS).read_bytes() == (tiny_model / SUMS).read_bytes()


def test_a_setup_of_a_local_directory_does_not_record_over_changed_bytes(tiny_model, tmp_path):
    """`k3 setup --source DIR` hashes the files it finds (origin "measured") and records the tensor checksums: a
    record the bytes fail stays, now and on the next setup or verify (a measured hash proves nothing)."""
    model = shutil.copytree(tiny_model, tmp_path / "m")
    flip(model)
    sums = (model / SUMS).read_bytes()
    env = {**os.environ, "K3_CONFIG_DIR": str(tmp_path / "config")}
    for _ in range(2):
        done = subprocess.run([sys.executable, "-m", "k3core", "setup", "--source", str(model), "--yes", "--no-pack"],
                              capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"1 shard(s) differ from the tensor checksums recorded in {SUMS}, which are kept: {SHARD}" in done.stderr
    rc, out, _ = verify(model)
    assert rc == 2 and f"BAD  {SHARD}: 1 tensor(s) differ" in out
    assert (model / SUMS).read_bytes() == sums


# ---- k3 make-model on a disk that fills up ---------------------------------------------------------------------
def _file_size_limit(limit):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def test_make_model_on_a_full_disk_is_exit_2_and_leaves_nothing(tiny_model, tmp_path):
    """The disk fills up in the middle of a shard (RLIMIT_FSIZE: EFBIG past 100 kB): exit 2 naming the path, no
    DIR.partial left, and a model --force was replacing still there, whole."""
    target = shutil.copytree(tiny_model, tmp_path / "m")
    before = snapshot(target)
    done = subprocess.run([sys.executable, "-m", "k3core", "make-model", str(target), "--force", "--quiet"],
                          capture_output=True, text=True, timeout=120, preexec_fn=_file_size_limit(100_000))
    assert done.returncode == 2, done.stderr
    assert f"{target}: cannot write the checkpoint on the filesystem holding {tmp_path}: File too large" in done.stderr
    assert "nothing was left behind (m.partial removed)" in done.stderr and "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"] and snapshot(target) == before


def test_make_model_enospc_names_the_space(tmp_path, monkeypatch, capsys):
    """ENOSPC (a real full disk; a tmpfs needs root to mount): the free space and the bytes needed are named."""
    import errno

    from k3core.testmodel import writer

    real = writer._write_files

    def fill_up(partial, *a):
        real(partial, *a)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(writer, "_write_files", fill_up)
    assert main(["make-model", str(tmp_path / "m"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'm'}: cannot write the checkpoint on the filesystem holding {tmp_path}: No space left on " \
           "device (3.8 MB of shards needed; it has" in err and "MB free); nothing was left behind" in err
    assert not any(tmp_path.iterdir())
