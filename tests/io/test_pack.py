"""`k3 pack` against the checkpoint it packs: every tensor's bytes through open_trunk equal
ShardIndex.read; deterministic bytes; resume after an exception, a torn write and real kill -9s;
verify naming a corrupted run; open_trunk refusing truncated, foreign and unknown-version packs."""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import numpy as np
import pytest

from k3core.cli import pack as pack_cli
from k3core.io import pack
from k3core.io import trunk as trunkfmt
from k3core.format.checkpoint import PREFIX, VISION_PREFIXES, layer_prefix, open_checkpoint
from k3core.errors import K3Error, TrunkError, UnsoundRunError, UsageError
from k3core.io.trunk_reader import check_blocks

REPO = Path(__file__).resolve().parents[2]


class Stop(Exception):
    pass


def stop_after(k):
    """A progress callback that raises once k runs are on disk and recorded."""
    def progress(p):
        if p.run_finished and p.runs_done == k:
            raise Stop(k)
    return progress


def manifest(d):
    return json.loads((Path(d) / pack.MANIFEST).read_text())


def run_bytes(d, start=0):
    return sum(r["length"] for r in manifest(d)["runs"][start:])


@pytest.fixture(scope="module")
def reference(tiny_model, tmp_path_factory):
    """An uninterrupted pack of the tiny model: the bytes every other pack must reproduce."""
    out = tmp_path_factory.mktemp("reference") / "trunk"
    pack.pack(tiny_model, out)
    return out


def same_pack(a, b):
    return (Path(a) / pack.TRUNK).read_bytes() == (Path(b) / pack.TRUNK).read_bytes() and manifest(a) == manifest(b)


def cli(argv):
    """`k3 pack …` as cli.main will run it: K3Error → its exit code, message on stderr."""
    parser = argparse.ArgumentParser(prog="k3")
    pack_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["pack", *map(str, argv)])
    try:
        return args.func(args)
    except K3Error as e:
        print(f"k3: error: {e}", file=sys.stderr)
        return e.exit_code


# ---- what a pack holds ----------------------------------------------------------------------------
def test_every_tensor_read_through_the_pack_equals_the_checkpoint(tiny_model, reference):
    ckpt = open_checkpoint(tiny_model)
    trunk = trunkfmt.open_trunk(reference, ckpt)
    raw = trunk.path.read_bytes()
    seen = set()
    for key, run in trunk.runs.items():
        assert run.offset % 4096 == 0 and run.offset + run.padded <= len(raw) and run.verbatim
        params = run.params(raw[run.offset:run.offset + run.length])
        for name, p in params.items():
            full = run.prefix + name
            want = ckpt.index.read(full)
            assert p.name == name and p.dtype == ckpt.index[full].dtype and p.data.shape == want.shape
            assert p.data.dtype == want.dtype and p.data.tobytes() == want.tobytes(), full
            seen.add(full)
        assert (key == "model") == (run.layer is None)
    wanted = {n for n in ckpt.index.names() if not n.startswith(VISION_PREFIXES) and ".experts." not in n}
    assert seen == wanted
    assert set(trunk.runs) == {f"layer.{L}" for L in range(ckpt.config.num_hidden_layers)} | {"model"}
    assert all(n.startswith(PREFIX + "layers.") or n.startswith("language_model.") for n in seen)
    assert len(raw) % 4096 == 0 and len(raw) == trunk.manifest["trunk_bytes"]
    fp = trunk.manifest["checkpoint"]
    assert fp == trunkfmt.fingerprint(ckpt)
    assert [(s["name"], s["size"], s["header_sha256"]) for s in fp["shards"]] == \
        [(f.path.name, f.size, f.header_sha256) for f in ckpt.index.files]


def test_params_are_bf16_as_uint16_views_and_block_checks_catch_a_wrong_buffer(tiny_model, reference):
    trunk = trunkfmt.open_trunk(reference, open_checkpoint(tiny_model))
    run = trunk.layer(0)
    buf = bytearray(trunk.path.read_bytes()[run.offset:run.offset + run.padded])
    check_blocks(run, memoryview(buf), 0, run.length, trunk.path)
    w = run.weights(buf)
    assert w.prefix == layer_prefix(0) and w["self_attn.q_proj.weight"].data.dtype == np.uint16
    assert w["input_layernorm.weight"].data.dtype == np.float32
    buf[10] ^= 1
    with pytest.raises(UnsoundRunError, match="block 0 of trunk unit layer.0"):
        check_blocks(run, memoryview(buf), 0, run.length, trunk.path)
    with pytest.raises(TrunkError, match="buffer"):
        run.params(bytes(run.length - 1))


def test_same_checkpoint_packs_to_identical_bytes(tiny_model, reference, tmp_path):
    pack.pack(tiny_model, tmp_path / "again")
    assert same_pack(reference, tmp_path / "again")


def test_already_packed_does_nothing_and_says_so(tiny_model, reference, tmp_path):
    out = shutil.copytree(reference, tmp_path / "copy")
    before = (out / pack.TRUNK).stat().st_mtime_ns
    notes = []
    r = pack.pack(tiny_model, out, say=notes.append)
    assert r.status == "up-to-date" and r.bytes_copied == 0 and "nothing to do" in notes[0]
    assert (out / pack.TRUNK).stat().st_mtime_ns == before


def write_shard(path, tensors):
    """A safetensors file from (name, dtype, shape, bytes), in the order given."""
    header, at = {}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(data)]}
        at += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + b"".join(t[3] for t in tensors))


def test_runs_that_are_not_one_gap_free_span_are_copied_tensor_by_tensor(tiny_model, tmp_path):
    """Layer 1's trunk interleaved with its experts, layer 2's split over two shards, and a model run
    whose F32 tensors would land 2 bytes off alignment: each re-laid out, 64-byte aligned."""
    src = open_checkpoint(tiny_model)
    idx, out, weight_map = src.index, tmp_path / "model", {}
    out.mkdir()
    shutil.copy(tiny_model / "config.json", out)
    by_file = {}
    for name in idx.names():
        t = idx[name]
        by_file.setdefault(t.file.name, []).append((t.offset, (name, t.dtype, t.shape, idx.read_bytes(name))))
    files = {f: [x for _, x in sorted(ts)] for f, ts in by_file.items()}
    l1 = next(f for f, ts in files.items() if ts[0][0].startswith(layer_prefix(1)))
    trunk1 = [t for t in files[l1] if ".experts." not in t[0]]
    experts1 = [t for t in files[l1] if ".experts." in t[0]]
    files[l1] = [x for pair in zip(trunk1, experts1) for x in pair] + experts1[len(trunk1):] + trunk1[len(experts1):]
    l2 = next(f for f, ts in files.items() if ts[0][0].startswith(layer_prefix(2)))
    moved = files[l2].pop(0)
    files["model-extra.safetensors"] = [moved]
    head = next(f for f, ts in files.items() if any(n.endswith("embed_tokens.weight") for n, *_ in ts))
    files[head].insert(0, ("language_model.model.odd_bf16", "BF16", (3,), bytes(range(6))))
    for f, ts in files.items():
        write_shard(out / f, ts)
        weight_map.update({n: f for n, *_ in ts})
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    pack.pack(out, tmp_path / "trunk")
    ckpt = open_checkpoint(out)
    trunk = trunkfmt.open_trunk(tmp_path / "trunk", ckpt)
    raw = trunk.path.read_bytes()
    assert {k for k, r in trunk.runs.items() if not r.verbatim} == {"layer.1", "layer.2", "model"}
    for run in trunk.runs.values():
        if not run.verbatim:
            assert all(t.offset % 64 == 0 for t in run.tensors)
        for name, p in run.params(raw[run.offset:run.offset + run.length]).items():
            assert p.data.tobytes() == ckpt.index.read_bytes(run.prefix + name)
    assert pack.verify(tmp_path / "trunk", out, deep=True) == []


# ---- interruption and resume ---------------------------------------------------------------------
def test_pack_interrupted_after_k_runs_resumes_with_only_the_rest(tiny_model, reference, tmp_path):
    out = tmp_path / "trunk"
    with pytest.raises(Stop):
        pack.pack(tiny_model, out, progress=stop_after(4))
    assert (out / pack.PARTIAL).exists() and (out / pack.STATE).exists() and not (out / pack.TRUNK).exists()
    notes = []
    r = pack.pack(tiny_model, out, say=notes.append)
    assert r.status == "resumed" and r.runs_copied == r.runs - 4 and r.bytes_copied == run_bytes(reference, 4)
    assert any("resuming after 4 of" in n for n in notes)
    assert same_pack(reference, out) and not (out / pack.STATE).exists()


@pytest.mark.parametrize("damage", ["truncated mid-run", "tail zeroed, size kept", "garbage after it"])
def test_torn_last_run_is_detected_by_its_hash_and_copied_again(tiny_model, reference, tmp_path, damage):
    """A last recorded run cut short or with a zeroed tail is copied again; bytes after an intact
    one are cut off (they would otherwise survive in the padding before the next run)."""
    out = tmp_path / "trunk"
    with pytest.raises(Stop):
        pack.pack(tiny_model, out, progress=stop_after(4))
    last = json.loads((out / pack.STATE).read_text())["done"][-1]
    end = last["offset"] + last["length"]
    if damage == "garbage after it":
        with open(out / pack.PARTIAL, "r+b") as f:
            f.seek(end)
            f.write(b"\xff" * 50_000)
    else:
        size = (out / pack.PARTIAL).stat().st_size
        os.truncate(out / pack.PARTIAL, last["offset"] + last["length"] // 2)
        if damage == "tail zeroed, size kept":
            os.truncate(out / pack.PARTIAL, size)
    notes = []
    r = pack.pack(tiny_model, out, say=notes.append)
    torn = damage != "garbage after it"
    assert r.bytes_copied == run_bytes(reference, 3 if torn else 4)
    assert any(last["key"] in n and "torn" in n for n in notes) == torn
    assert same_pack(reference, out)


def test_a_damaged_state_file_is_not_trusted(tiny_model, reference, tmp_path):
    out = tmp_path / "trunk"
    with pytest.raises(Stop):
        pack.pack(tiny_model, out, progress=stop_after(3))
    state = json.loads((out / pack.STATE).read_text())
    state["done"][0]["length"] += 1
    (out / pack.STATE).write_text(json.dumps(state))
    notes = []
    assert pack.pack(tiny_model, out, say=notes.append).bytes_copied == run_bytes(reference)
    assert any("damaged" in n for n in notes) and same_pack(reference, out)


def test_state_of_another_checkpoint_starts_over_and_says_so(tiny_model, model_factory, tmp_path):
    other = model_factory("tiny", 1)
    out = tmp_path / "trunk"
    with pytest.raises(Stop):
        pack.pack(tiny_model, out, progress=stop_after(3))
    notes = []
    r = pack.pack(other, out, say=notes.append)
    assert r.status == "packed" and r.runs_copied == r.runs
    assert any("another checkpoint" in n and "model-00001" in n for n in notes)
    pack.pack(other, tmp_path / "clean")
    assert same_pack(tmp_path / "clean", out)


def test_a_finished_pack_of_another_checkpoint_is_replaced(tiny_model, model_factory, reference, tmp_path):
    out = tmp_path / "trunk"
    pack.pack(model_factory("tiny", 1), out)
    notes = []
    assert pack.pack(tiny_model, out, say=notes.append).status == "packed"
    assert any("replacing" in n for n in notes) and same_pack(reference, out)


def run_script(code, **kw):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_kill_9_in_the_middle_of_a_run_resumes_after_the_last_recorded_run(tiny_model, reference, tmp_path):
    out = tmp_path / "trunk"
    proc = run_script(f"""
        import os, signal
        from k3core.io import pack
        def progress(p):                 # layer.3 partly written, layers 0-2 recorded: SIGKILL, no cleanup
            if p.key == "layer.3" and p.moved > 0 and not p.run_finished:
                os.kill(os.getpid(), signal.SIGKILL)
        pack.pack({str(tiny_model)!r}, {str(out)!r}, progress=progress, chunk_bytes=4096)
        """)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    state = json.loads((out / pack.STATE).read_text())
    assert [d["key"] for d in state["done"]] == ["layer.0", "layer.1", "layer.2"]
    assert (out / pack.PARTIAL).stat().st_size > state["done"][-1]["offset"] + state["done"][-1]["length"]
    r = pack.pack(tiny_model, out)
    assert r.runs_copied == r.runs - 3 and r.bytes_copied == run_bytes(reference, 3)
    assert same_pack(reference, out)


def test_kill_9_of_a_running_k3_pack_from_outside_resumes(tiny_model, reference, tmp_path):
    """`k3 pack MODEL TRUNK` (the CLI path, writes slowed down) killed by the parent at whatever it is doing."""
    out = tmp_path / "trunk"
    proc = run_script(f"""
        import argparse, sys, time
        from k3core.cli import pack as pack_cli
        from k3core.io import pack
        write = pack._pwrite_full
        pack._pwrite_full = lambda *a: (time.sleep(0.08), write(*a))
        parser = argparse.ArgumentParser(prog="k3")
        pack_cli.add_parser(parser.add_subparsers())
        args = parser.parse_args(["pack", {str(tiny_model)!r}, {str(out)!r}])
        sys.exit(args.func(args))
        """)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        state = pack._read_json(out / pack.STATE)
        if state and len(state["done"]) >= 3:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err.decode()
    assert not (out / pack.TRUNK).exists()
    k = len(json.loads((out / pack.STATE).read_text())["done"])
    assert 3 <= k < 14 and "  packed layer.0 (" in err.decode() and "[1/14]" in err.decode()  # a line per run off a TTY
    r = pack.pack(tiny_model, out)
    assert r.bytes_copied == run_bytes(reference, k) and same_pack(reference, out)


def test_ctrl_c_keeps_finished_runs_and_says_how_to_resume(tiny_model, reference, tmp_path, monkeypatch, capsys):
    class Interrupt(pack_cli.PackMeter):
        def __call__(self, p):
            if p.run_finished and p.runs_done == 2:
                raise KeyboardInterrupt
    monkeypatch.setattr(pack_cli, "PackMeter", Interrupt)
    with pytest.raises(KeyboardInterrupt):   # cli.main turns it into exit 130
        cli([tiny_model, tmp_path / "trunk"])
    assert "run the same command to resume" in capsys.readouterr().err
    monkeypatch.undo()
    assert cli([tiny_model, tmp_path / "trunk", "--quiet"]) == 0
    assert same_pack(reference, tmp_path / "trunk")


def test_no_free_space_is_refused_before_anything_is_written(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: types.SimpleNamespace(total=1 << 40, used=1 << 40, free=0))
    out = tmp_path / "new" / "trunk"
    with pytest.raises(TrunkError, match="not enough free space") as e:
        pack.pack(tiny_model, out)
    assert e.value.exit_code == 2 and not (tmp_path / "new").exists()


def test_a_second_packer_on_the_same_directory_is_refused(tiny_model, tmp_path):
    import fcntl
    out = tmp_path / "trunk"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(TrunkError, match="another k3 pack"):
            pack.pack(tiny_model, out)
    finally:
        os.close(fd)
    assert list(out.iterdir()) == []


# ---- verify and open_trunk -----------------------------------------------------------------------
def flip_byte_in(out, key, at=100):
    run = next(r for r in manifest(out)["runs"] if r["key"] == key)
    with open(out / pack.TRUNK, "r+b") as f:
        f.seek(run["offset"] + at)
        b = f.read(1)
        f.seek(run["offset"] + at)
        f.write(bytes([b[0] ^ 0x40]))


def test_verify_names_a_corrupted_run(tiny_model, reference, tmp_path, capsys):
    out = shutil.copytree(reference, tmp_path / "copy")
    assert cli(["--verify", out, "--model", tiny_model]) == 0
    assert "every sha256 matches" in capsys.readouterr().out
    flip_byte_in(out, "layer.5")
    problems = pack.verify(out)
    assert len(problems) == 1 and "layer.5" in problems[0]
    assert cli(["--verify", out]) == 2
    assert "run layer.5" in capsys.readouterr().err


def test_verify_with_another_model_names_the_fingerprint_difference(model_factory, reference, capsys):
    assert cli(["--verify", reference, "--model", model_factory("tiny", 1)]) == 2
    assert "model-00001-of-000015.safetensors: tensor data changed" in capsys.readouterr().err


def test_open_trunk_refuses_a_truncated_trunk_bin_naming_file_and_run(tiny_model, reference, tmp_path):
    out = shutil.copytree(reference, tmp_path / "copy")
    cut = next(r for r in manifest(out)["runs"] if r["key"] == "layer.7")
    os.truncate(out / pack.TRUNK, cut["offset"] + 10)
    with pytest.raises(TrunkError, match="layer.7") as e:
        trunkfmt.open_trunk(out, open_checkpoint(tiny_model))
    assert e.value.file == str(out / pack.TRUNK) and "truncated" in str(e.value)


def test_open_trunk_refuses_a_pack_of_another_checkpoint_naming_the_shard(model_factory, reference):
    other = open_checkpoint(model_factory("tiny", 1))   # same headers and config as seed 0; other data
    with pytest.raises(TrunkError, match=r"shard model-00001-of-000015\.safetensors: tensor data changed"):
        trunkfmt.open_trunk(reference, other)


def test_open_trunk_names_a_changed_shard_size_and_config(tiny_model, reference, tmp_path):
    model = shutil.copytree(tiny_model, tmp_path / "model")
    shard = model / "model-00003-of-000015.safetensors"
    with open(shard, "ab") as f:
        f.write(b"\0" * 8)
    (model / "config.json").write_text((model / "config.json").read_text() + " ")
    with pytest.raises(TrunkError, match=r"model-00003-of-000015\.safetensors: \d+ bytes when packed.*config\.json changed"):
        trunkfmt.open_trunk(reference, open_checkpoint(model))


def test_open_trunk_refuses_an_unknown_manifest_version(tiny_model, reference, tmp_path):
    out = shutil.copytree(reference, tmp_path / "copy")
    m = manifest(out)
    (out / pack.MANIFEST).write_text(json.dumps({**m, "version": 7}))
    with pytest.raises(TrunkError, match="manifest version 7"):
        trunkfmt.open_trunk(out, open_checkpoint(tiny_model))
    old = {**m, "version": 1, "runs": [{k: v for k, v in r.items() if k != "block_sums"} for r in m["runs"]]}
    (out / pack.MANIFEST).write_text(json.dumps(old))  # a raw pack from before block checksums
    with pytest.raises(TrunkError, match="without block checksums.*re-pack"):
        trunkfmt.open_trunk(out, open_checkpoint(tiny_model))
    (out / pack.MANIFEST).write_text(json.dumps({**m, "runs": [{**m["runs"][0], "block_sums": []}]}))
    with pytest.raises(TrunkError, match="0 block checksums"):
        trunkfmt.load_trunk(out)
    (out / pack.MANIFEST).write_text(json.dumps({**m, "runs": [{**m["runs"][0], "offset": 100}]}))
    with pytest.raises(TrunkError, match="malformed"):
        trunkfmt.load_trunk(out)
    (out / pack.MANIFEST).unlink()
    with pytest.raises(TrunkError, match="k3 pack"):
        trunkfmt.load_trunk(out)


def test_cli_help_and_usage(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli(["--help"])
    text = capsys.readouterr().out
    assert "Resumable" in text and "k3 pack --verify" in text and "130" in text
    assert cli([tmp_path]) == UsageError.exit_code
    assert cli(["--verify", tmp_path, tmp_path]) == UsageError.exit_code
    assert "use: k3 pack --verify TRUNK_DIR" in capsys.readouterr().err
