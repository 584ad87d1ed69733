"""A packed trunk's manifest.json is proven against the checkpoint's headers, never trusted: each row edits one
thing in a copy of a good manifest, and both `k3 run --trunk` and `k3 pack --verify --model` refuse it with exit 2,
naming the run and the field (`k3 pack --verify` alone too, by the run table and the manifest's own sha256);
`trunk_file` cannot point outside the pack; a resumed pack re-hashes every run it kept; another model's pack is
named as such; and k3 pack refuses a TRUNK_DIR it must not write (a file, a read-only disk, a symlinked partial
file), naming it and touching nothing."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from k3core.cli.main import main
from k3core.io import pack

Q, K, V = "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"


@pytest.fixture(scope="module")
def packed(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("pack") / "raw"
    pack.pack(tiny_model, out)
    return out


def tensor(m, key, name):
    run = next(r for r in m["runs"] if r["key"] == key)
    return next(t for t in run["tensors"] if t["name"] == name)


def run_of(m, key):
    return next(r for r in m["runs"] if r["key"] == key)


def point_k_at_q(m):
    tensor(m, "layer.4", K)["offset"] = tensor(m, "layer.4", Q)["offset"]


def swap_q_and_k(m):
    ts = run_of(m, "layer.4")["tensors"]
    i, j = [n for n, t in enumerate(ts) if t["name"] in (Q, K)]
    ts[i], ts[j] = ts[j], ts[i]


def swap_entries_keeping_order(m):  # k_proj's entry describes v_proj's bytes and the other way round
    k, v = tensor(m, "layer.4", K), tensor(m, "layer.4", V)
    for f in ("offset", "nbytes", "shape"):
        k[f], v[f] = v[f], k[f]
    ts = run_of(m, "layer.4")["tensors"]
    ts.sort(key=lambda t: t["offset"])


def reshape(m):
    t = tensor(m, "layer.4", Q)
    t["shape"] = [t["shape"][1], t["shape"][0]]


def retype(m):
    t = tensor(m, "layer.1", "input_layernorm.weight")
    t["dtype"], t["shape"] = "BF16", [t["shape"][0] * 2]


# (what, edit, what the message names)
ROWS = [
    ("a tensor offset pointed at another tensor", point_k_at_q, f"tensor {K}: at offset"),
    ("two entries swapped", swap_q_and_k, "run layer.4"),
    ("two tensors' entries exchanged", swap_entries_keeping_order, f"run layer.4: tensor {V} is listed where"),
    ("an entry removed", lambda m: run_of(m, "layer.4")["tensors"].remove(tensor(m, "layer.4", K)),
     f"run layer.4: tensor {K} is missing from the manifest"),
    ("an entry renamed", lambda m: tensor(m, "layer.4", K).update(name="self_attn.kk_proj.weight"),
     f"run layer.4: tensor {K} is missing"),
    ("a tensor reshaped", reshape, f"tensor {Q}: shape"),
    ("a tensor retyped", retype, "tensor input_layernorm.weight: dtype"),
    ("a run's offset moved", lambda m: run_of(m, "layer.2").update(offset=run_of(m, "layer.2")["offset"] + 4096),
     "run layer.3 overlaps run layer.2"),
    ("a run removed", lambda m: m["runs"].remove(run_of(m, "layer.3")), "no run for layer"),
    ("trunk_file outside the pack", lambda m: m.update(trunk_file="../x"), "trunk_file"),
    ("trunk_file an absolute path", lambda m: m.update(trunk_file="/etc/passwd"), "trunk_file"),
    ("a run without its key", lambda m: m["runs"][2].pop("key"), "runs[2]: field 'key' is missing"),
    ("a tensor's offset a string", lambda m: tensor(m, "layer.1", Q).update(offset="12"), f"tensor {Q}: field 'offset'"),
    ("alignment 0", lambda m: m.update(alignment=0), "block_bytes"),
    ("runs not a list", lambda m: m.update(runs={}), "field 'runs'"),
    ("a block checksum not hex", lambda m: run_of(m, "layer.0")["block_sums"].__setitem__(0, "zz"),
     "run layer.0: block_sums"),
    ("a block entry with too few fields", lambda m: m.update(codec="planes", version=4) or
     run_of(m, "layer.0").update(blocks=[[0, 1]]), "run layer.0: blocks"),
]


def edited(packed, tmp_path, edit):
    copy = shutil.copytree(packed, tmp_path / "t")
    m = json.loads((copy / "manifest.json").read_text())
    edit(m)
    (copy / "manifest.json").write_text(json.dumps(m))
    return copy


@pytest.mark.parametrize("what, edit, names", ROWS, ids=[r[0] for r in ROWS])
def test_an_edited_manifest_is_refused_by_a_run_naming_the_run_and_field(packed, tiny_model, tmp_path, capsys, what,
                                                                          edit, names):
    copy = edited(packed, tmp_path, edit)
    code = main(["run", str(tiny_model), "--trunk", str(copy), "--ids", "0,1,2", "--gen", "2"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert names in err and "Traceback" not in err and "Error(" not in err


@pytest.mark.parametrize("what, edit, names", ROWS, ids=[r[0] for r in ROWS])
def test_an_edited_manifest_fails_pack_verify_naming_the_run_and_field(packed, tiny_model, tmp_path, capsys, what,
                                                                        edit, names):
    copy = edited(packed, tmp_path, edit)
    code = main(["pack", "--verify", str(copy), "--model", str(tiny_model)])
    out = capsys.readouterr()
    assert code == 2, out
    assert names in out.err and "Traceback" not in out.err


def test_the_untouched_manifest_passes_both(packed, tiny_model, capsys):
    assert main(["run", str(tiny_model), "--trunk", str(packed), "--ids", "0,1,2", "--gen", "2"]) == 0
    assert main(["pack", "--verify", str(packed), "--model", str(tiny_model)]) == 0


class Stop(Exception):
    pass


def test_a_resumed_pack_rehashes_every_run_it_kept(tiny_model, packed, tmp_path):
    out = tmp_path / "t"

    def stop_after_four_runs(p):
        if p.run_finished and p.runs_done >= 4:
            raise Stop

    with pytest.raises(Stop):
        pack.pack(tiny_model, out, progress=stop_after_four_runs)
    state = json.loads((out / "pack-state.json").read_text())
    assert len(state["done"]) == 4
    first = state["done"][1]  # not the last one kept: only the last was re-hashed before
    with open(out / "trunk.bin.partial", "r+b") as f:
        f.seek(first["offset"] + 100)
        byte = f.read(1)[0]
        f.seek(first["offset"] + 100)
        f.write(bytes([byte ^ 1]))
    notes = []
    result = pack.pack(tiny_model, out, say=notes.append)
    assert result.status == "resumed" and result.runs_copied == result.runs - 1
    assert any(first["key"] in n and "changed since it was written" in n for n in notes), notes
    assert (out / "trunk.bin").read_bytes() == (packed / "trunk.bin").read_bytes()


# ---- `k3 pack --verify` without the checkpoint: never a pass for an edited manifest ---------------------------
@pytest.mark.parametrize("what, edit, names", ROWS, ids=[r[0] for r in ROWS])
def test_an_edited_manifest_fails_pack_verify_without_the_model(packed, tmp_path, capsys, what, edit, names):
    """Without --model the tensor table cannot be proven against headers: the run table's order and offsets, and
    the manifest's own sha256 (manifest_sha256), catch every edit; the message names the run and field, or the
    sha256 and the --model that would say more."""
    copy = edited(packed, tmp_path, edit)
    code = main(["pack", "--verify", str(copy)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert names in err or "its manifest_sha256 does not match its contents" in err, err
    assert "Traceback" not in err


def test_a_manifest_without_its_own_sha256_needs_the_model(packed, tiny_model, tmp_path, capsys):
    """A pack made before manifest_sha256: without --model its tensor table cannot be judged, so verify refuses,
    asking for --model; with it, the pack passes."""
    copy = edited(packed, tmp_path, lambda m: m.pop("manifest_sha256"))
    assert main(["pack", "--verify", str(copy)]) == 2
    assert "can only be proven against the checkpoint: give --model MODEL_DIR" in capsys.readouterr().err
    assert main(["pack", "--verify", str(copy), "--model", str(tiny_model)]) == 0


def test_the_untouched_manifest_passes_verify_without_the_model(packed, capsys):
    assert main(["pack", "--verify", str(packed)]) == 0
    assert "the manifest is the one k3 pack wrote (its own sha256 matches)" in capsys.readouterr().out


# ---- where k3 pack writes: never through a symlink, never onto a file, never on a read-only disk ---------------
def row(case, *values, full=False):
    return pytest.param(*values, id=case, marks=[pytest.mark.faults_full] if full else [])


def partial_symlink(t):
    (t / "victim").write_bytes(b"precious")
    (t / "T").mkdir()
    os.symlink(t / "victim", t / "T" / "trunk.bin.partial")
    return t / "T"


def partial_fifo(t):
    (t / "T").mkdir()
    os.mkfifo(t / "T" / "trunk.bin.partial")
    return t / "T"


def a_file(t):
    (t / "T").write_bytes(b"precious")
    return t / "T"


def read_only(t, monkeypatch):
    """statvfs says what a read-only mount says (mounting one needs root)."""
    real = os.statvfs

    class RO:
        def __init__(self, st):
            self.st = st

        def __getattr__(self, name):
            return self.st.f_flag | os.ST_RDONLY if name == "f_flag" else getattr(self.st, name)

    monkeypatch.setattr(os, "statvfs", lambda p: RO(real(p)))
    return t / "T"


def trunk_a_directory(t):
    (t / "T" / "trunk.bin").mkdir(parents=True)
    return t / "T"


# (setup(tmp_path, monkeypatch) -> TRUNK_DIR, needle ({t}: tmp_path), check(tmp_path): nothing lost)
PACK_CASES = [
    row("partial-a-symlink-to-a-file", lambda t, mp: partial_symlink(t),
        "trunk.bin.partial is a symlink (to {t}/victim), not the partial file k3 pack writes; k3 pack never writes "
        "through it: move it away, then run the same command again (file {t}/T/trunk.bin.partial)",
        lambda t: (t / "victim").read_bytes() == b"precious" and not (t / "T" / "trunk.bin").exists()),
    row("partial-a-fifo", lambda t, mp: partial_fifo(t), "trunk.bin.partial is not a regular file",
        lambda t: not (t / "T" / "trunk.bin").exists()),
    row("trunk.bin-a-directory", lambda t, mp: trunk_a_directory(t), "trunk.bin is not a regular file",
        lambda t: (t / "T" / "trunk.bin").is_dir()),
    row("trunk-dir-an-existing-file", lambda t, mp: a_file(t),
        "the pack's directory exists and is not a directory: give TRUNK_DIR as a new path or a directory "
        "(file {t}/T)", lambda t: (t / "T").read_bytes() == b"precious"),
    row("trunk-dir-on-a-read-only-filesystem", read_only,
        "the filesystem holding {t} is mounted read-only: the pack cannot be written there", lambda t: not
        (t / "T").exists()),
]


@pytest.mark.parametrize("setup, needle, check", PACK_CASES)
def test_pack_refuses_a_target_it_must_not_write_naming_it(tiny_model, tmp_path, monkeypatch, capsys, setup, needle,
                                                           check):
    trunk_dir = setup(tmp_path, monkeypatch)
    code = main(["pack", str(tiny_model), str(trunk_dir), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert needle.format(t=tmp_path) in err and "Traceback" not in err and "runtime failure" not in err
    assert check(tmp_path)


def test_another_models_pack_is_named_as_such(packed, model_factory, capsys):
    """`--trunk` at the pack of another checkpoint: said before any of its runs is laid out (it lacks layers this
    model has), naming both."""
    other = model_factory("small")
    code = main(["run", str(other), "--trunk", str(packed), "--ids", "0,1", "--gen", "2"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{packed} was packed from another checkpoint than {other}: none of the 15 shards it was packed from" in err
    assert "no run for layer" not in err


def test_a_disk_that_fills_up_mid_pack_is_exit_2_and_the_pack_resumes(tiny_model, packed, tmp_path):
    """EFBIG past 1 MB (RLIMIT_FSIZE, as a full disk would say ENOSPC): exit 2 naming the pack, the finished runs
    kept; the same command then finishes the same bytes."""
    import resource
    import subprocess
    import sys

    out = tmp_path / "T"
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    done = subprocess.run([sys.executable, "-m", "k3core", "pack", str(tiny_model), str(out), "--quiet"],
                          capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, limit)))
    assert done.returncode == 2, done.stderr
    assert "cannot write the pack: File too large" in done.stderr and f"(file {out})" in done.stderr
    assert "the runs finished so far are kept" in done.stderr and "Traceback" not in done.stderr
    assert json.loads((out / "pack-state.json").read_text())["done"]
    assert main(["pack", str(tiny_model), str(out), "--quiet"]) == 0
    assert (out / "trunk.bin").read_bytes() == (packed / "trunk.bin").read_bytes()
