"""A packed trunk's manifest.json is proven against the checkpoint's headers, never trusted: each row edits one
thing in a copy of a good manifest, and both `k3 run --trunk` and `k3 pack --verify --model` refuse it with exit 2,
naming the run and the field; `trunk_file` cannot point outside the pack; a resumed pack re-hashes every run it
kept."""
from __future__ import annotations

import json
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
