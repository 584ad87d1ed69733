"""`k3 pack --draft`: every tensor of a draft trunk against an independent re-derivation from the packed trunk's bf16
values (codes and scales bit for bit), the error bounds, deterministic bytes, resume after an interruption and a torn
write, damaged runs caught by the reader and by verify, drafts of another trunk refused, --draft-layers, the
reference product, and the command's exit codes."""
import json
import os
import re
import shutil
import types
from pathlib import Path

import numpy as np
import pytest

from k3core.errors import TrunkError, UnsoundRunError, UsageError
from k3core.format.checkpoint import EMBED, HEAD
from k3core.plugins.reference_kernels import ReferenceKernels
from k3core.io import draft_pack, pack
from k3core.io.draft_trunk import (COPIED, DATA, INT4, INT8, DraftSpec, draft_bytes, draft_linear, open_draft_trunk,
                                   parse_layers, quantize)
from k3core.io.trunk import load_trunk, seal

from .test_pack import Stop, cli, stop_after

LIMIT = {"int8": 127, "int4": 7}


@pytest.fixture(scope="module")
def trunk_dir(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("draft") / "trunk"
    pack.pack(tiny_model, out)
    return out


@pytest.fixture(scope="module")
def drafts(trunk_dir):
    """An uninterrupted draft of each kind, every layer: the bytes every other derivation must reproduce."""
    return {kind: draft_pack.derive_draft(trunk_dir, DraftSpec(kind, tuple(range(13)))).directory
            for kind in ("int8", "int4")}


def data(d):
    return (Path(d) / DATA).read_bytes()


def manifest(d):
    return json.loads((Path(d) / "manifest.json").read_text())


def source_tensors(trunk_dir):
    """{run key: {name: float32 values or raw bytes}} read straight from trunk.bin, not through k3's readers."""
    trunk, raw = load_trunk(trunk_dir), (Path(trunk_dir) / "trunk.bin").read_bytes()
    out = {}
    for key, run in trunk.runs.items():
        out[key] = {}
        for t in run.tensors:
            b = raw[run.offset + t.offset:run.offset + t.offset + t.nbytes]
            if t.dtype == "BF16" and len(t.shape) == 2:
                bits = np.frombuffer(b, np.uint16).astype(np.uint32) << 16
                out[key][t.name] = bits.view(np.float32).reshape(t.shape)
            else:
                out[key][t.name] = (t.dtype, b)
    return out


def rederive(w, kind):
    """The derivation of docs/DRAFT-TRUNK.md written again, a row (and a group) at a time: (codes as stored, scales)."""
    limit, width = LIMIT[kind], w.shape[1] if kind == "int8" else 32
    codes, scales = [], []
    for row in w:
        row = np.concatenate([row, np.zeros(-len(row) % width, np.float32)])
        c, s = [], []
        for g in range(0, len(row), width):
            piece = row[g:g + width].astype(np.float64)
            scale = np.float32(np.float32(np.abs(piece).max()) / np.float32(limit))
            c += [0] * width if scale == 0 else [max(-limit, min(limit, round(x / float(scale)))) for x in piece]
            s.append(scale)
        codes.append(c)
        scales.append(s)
    codes, scales = np.array(codes), np.array(scales, np.float32)
    if kind == "int8":
        return codes.astype(np.int8), scales[:, 0]
    nibbles = codes + 8                                       # offset binary, the even column in the low nibble
    return (nibbles[:, 0::2] + 16 * nibbles[:, 1::2]).astype(np.uint8), scales


def codes_and_scales(t):
    """A quantized DraftTensor's codes as integers [out, in] and each weight's scale, float64, unpacked here."""
    rows, cols = t.shape
    if t.kind == INT8:
        return t.data.astype(np.int64), t.scales.astype(np.float64)[:, None].repeat(cols, 1)
    codes = np.empty((rows, 2 * t.data.shape[1]), np.int64)
    codes[:, 0::2], codes[:, 1::2] = (t.data & 15).astype(np.int64) - 8, (t.data >> 4).astype(np.int64) - 8
    return codes[:, :cols], t.scales.astype(np.float64).repeat(32, 1)[:, :cols]


def every_tensor(draft):
    yield from ((f"layer.{L}", draft.layer(L)) for L in draft.spec.layers)
    yield "model", draft.model()


# ---- what a draft holds ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_every_tensor_equals_an_independent_rederivation_bit_for_bit(trunk_dir, drafts, kind):
    source = source_tensors(trunk_dir)
    draft = open_draft_trunk(drafts[kind], load_trunk(trunk_dir))
    matrices = 0
    for key, tensors in every_tensor(draft):
        assert set(tensors) == set(source[key]) - {EMBED}     # the embedding stays in the main trunk
        for name, t in tensors.items():
            want = source[key][name]
            if isinstance(want, tuple):
                assert t.kind == COPIED and t.dtype == want[0] and t.data.tobytes() == want[1], (key, name)
                continue
            codes, scales = rederive(want, kind)
            assert t.kind == {"int8": INT8, "int4": INT4}[kind] and t.dtype == "BF16" and t.shape == want.shape
            assert np.array_equal(t.data, codes), (key, name)
            assert np.array_equal(t.scales.view(np.uint32), scales.view(np.uint32)), (key, name)
            matrices += 1
    assert matrices == sum(not isinstance(x, tuple) for v in source.values() for x in v.values()) - 1  # not EMBED
    assert draft.head().shape == source["model"][HEAD].shape


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_dequantized_weights_are_within_half_a_scale_of_the_bf16_values(trunk_dir, drafts, kind):
    source = source_tensors(trunk_dir)
    for key, tensors in every_tensor(open_draft_trunk(drafts[kind], load_trunk(trunk_dir))):
        for name, t in tensors.items():
            if t.kind == COPIED:
                continue
            w = source[key][name].astype(np.float64)
            codes, scale = codes_and_scales(t)
            # dequantized() is code * scale rounded to float32 once (in float64 the product is exact)
            assert np.array_equal(t.dequantized(), (codes * scale).astype(np.float32)), (key, name)
            # 1e-12: the float64 quotient w / scale is rounded once before it is rounded to a code
            assert np.all(np.abs(w - codes * scale) <= scale / 2 * (1 + 1e-12)), (key, name)
            # a scale too large would pass the bound too: the largest weight of each row/group takes the limit
            assert np.abs(codes).max() == LIMIT[kind]


def test_quantize_rounds_half_to_even_and_gives_a_zero_row_a_zero_scale():
    w = np.array([[127, 0.5, 1.5, 2.5, -0.5, -1.5], [0, 0, 0, 0, 0, 0]], np.float32)
    codes, scales = quantize(INT8, w, "t")
    assert scales.tolist() == [1.0, 0.0]
    assert codes.tolist() == [[127, 0, 2, 2, 0, -2], [0] * 6]   # half away from zero would give 1, 3, -1, -2
    codes, scales = quantize(INT4, np.array([[7, -7, 1, 0] + [0] * 30], np.float32), "t")
    assert scales.shape == (1, 2) and scales[0].tolist() == [1.0, 0.0]
    assert codes.shape == (1, 32) and codes[0, :2].tolist() == [0x1F, 0x89]  # 7+8 | (-7+8)<<4, 1+8 | (0+8)<<4
    assert codes[0, 17:].tolist() == [0x88] * 15                               # the padding: zero codes


def test_a_weight_that_is_not_finite_is_named_not_quantized():
    w = np.ones((3, 8), np.float32)
    w[2, 5] = np.nan
    with pytest.raises(TrunkError, match="layers.1.mlp.up_proj.weight: row 2 holds a NaN"):
        quantize(INT8, w, "layers.1.mlp.up_proj.weight")


def test_two_derivations_give_the_same_bytes_and_the_draft_its_planned_size(trunk_dir, drafts, tmp_path):
    again = draft_pack.derive_draft(trunk_dir, DraftSpec("int4", tuple(range(13))), tmp_path / "again")
    assert data(again.directory) == data(drafts["int4"]) and manifest(again.directory) == manifest(drafts["int4"])
    assert again.draft_bytes == len(data(again.directory)) == draft_bytes(load_trunk(trunk_dir), "int4", range(13))


def test_a_draft_of_a_lossless_pack_equals_the_draft_of_the_raw_one(tiny_model, drafts, tmp_path):
    """The source is read through the trunk's reader: a planes-coded pack restores the same bf16 bytes."""
    pack.pack(tiny_model, tmp_path / "z", codec="planes")
    r = draft_pack.derive_draft(tmp_path / "z", DraftSpec("int8", tuple(range(13))))
    assert data(r.directory) == data(drafts["int8"])


def test_a_finished_draft_is_up_to_date_and_not_rewritten(trunk_dir, drafts, tmp_path):
    out = shutil.copytree(drafts["int8"], tmp_path / "copy")
    before, notes = (out / DATA).stat().st_mtime_ns, []
    r = draft_pack.derive_draft(trunk_dir, DraftSpec("int8", tuple(range(13))), out, say=notes.append)
    assert r.status == "up-to-date" and r.bytes_written == 0 and "nothing to do" in notes[0]
    assert (out / DATA).stat().st_mtime_ns == before


# ---- --draft-layers -------------------------------------------------------------------------------------------
def test_draft_layers_are_parsed_and_bad_parts_named():
    assert parse_layers("0-11,40", 93) == tuple(range(12)) + (40,)
    assert parse_layers(" 5 , 1-2,2", 13) == (1, 2, 5)
    assert parse_layers(None, 3) == (0, 1, 2)
    for spec, needle in [("a", "'a' is not a layer number"), ("1,,2", "'' is not a layer number"),
                         ("5-3", "'5-3' runs backwards"),
                         ("0-13", "names layer 13, but the model has 13 layers (0-12)"),
                         ("-1", "'-1' is not"), ("1-2-3", "'1-2-3' is not")]:
        with pytest.raises(UsageError, match=re.escape(needle)):
            parse_layers(spec, 13)


def test_a_draft_of_some_layers_holds_those_and_says_none_for_the_rest(trunk_dir, drafts, tmp_path):
    trunk = load_trunk(trunk_dir)
    r = draft_pack.derive_draft(trunk_dir, DraftSpec("int8", (0, 1, 5)), tmp_path / "some")
    draft = open_draft_trunk(r.directory, trunk)
    full = open_draft_trunk(drafts["int8"], trunk)
    assert draft.layer(2) is None and draft.layer(12) is None
    assert all(np.array_equal(t.data, full.layer(5)[n].data) for n, t in draft.layer(5).items())
    assert r.draft_bytes == draft_bytes(trunk, "int8", (0, 1, 5)) < draft_bytes(trunk, "int8", range(13))
    with pytest.raises(TrunkError, match="no layer 13: it has 13"):
        draft.layer(13)


# ---- the reference product -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_draft_linear_matches_a_float64_product_of_the_dequantized_weights(trunk_dir, drafts, kind):
    draft = open_draft_trunk(drafts[kind], load_trunk(trunk_dir))
    x = np.random.default_rng(1).standard_normal((5, 128)).astype(np.float32)
    for t in (draft.layer(1)["self_attn.q_proj.weight"], draft.head(), draft.layer(0)["self_attn.f_b_proj.weight"]):
        xt = x[:, :t.shape[1]]
        codes, scale = codes_and_scales(t)
        w = codes * scale                                     # the dequantized weights in float64, exactly
        y = draft_linear(t, xt, ReferenceKernels())
        assert y.dtype == np.float32 and y.shape == (5, t.shape[0])
        bound = 4 * t.shape[1] * np.finfo(np.float32).eps * (np.abs(xt) @ np.abs(w).T)  # float32 rounding, summed
        assert np.all(np.abs(y - xt.astype(np.float64) @ w.T) <= bound), t.name
        assert draft_linear(t, xt, ReferenceKernels()).tobytes() == y.tobytes()   # deterministic
    with pytest.raises(ValueError, match="takes float32"):
        draft_linear(t, xt.astype(np.float64), ReferenceKernels())


# ---- interruption and resume ---------------------------------------------------------------------------------
def test_an_interrupted_derivation_resumes_with_only_the_rest(trunk_dir, drafts, tmp_path):
    out, spec = tmp_path / "d", DraftSpec("int8", tuple(range(13)))
    with pytest.raises(Stop):
        draft_pack.derive_draft(trunk_dir, spec, out, progress=stop_after(4))
    assert (out / "draft.bin.partial").exists() and not (out / DATA).exists()
    notes = []
    r = draft_pack.derive_draft(trunk_dir, spec, out, say=notes.append)
    assert r.status == "resumed" and r.runs_written == r.runs - 4 and any("resuming after 4 of 14" in n for n in notes)
    assert data(out) == data(drafts["int8"]) and manifest(out) == manifest(drafts["int8"])
    assert not (out / draft_pack.STATE).exists()


def test_a_torn_last_run_is_derived_again(trunk_dir, drafts, tmp_path):
    out, spec = tmp_path / "d", DraftSpec("int4", tuple(range(13)))
    with pytest.raises(Stop):
        draft_pack.derive_draft(trunk_dir, spec, out, progress=stop_after(4))
    last = json.loads((out / draft_pack.STATE).read_text())["done"][-1]
    size = (out / "draft.bin.partial").stat().st_size
    os.truncate(out / "draft.bin.partial", last["offset"] + last["length"] // 2)
    os.truncate(out / "draft.bin.partial", size)              # the tail zeroed, the size kept
    notes = []
    r = draft_pack.derive_draft(trunk_dir, spec, out, say=notes.append)
    assert r.runs_written == r.runs - 3 and any(last["key"] in n and "torn" in n for n in notes)
    assert data(out) == data(drafts["int4"])


def test_no_free_space_is_refused_saying_how_much_is_needed(trunk_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: types.SimpleNamespace(total=1 << 40, used=1 << 40, free=0))
    with pytest.raises(TrunkError, match=r"not enough free space: the draft needs 1\.6 MB more") as e:
        draft_pack.derive_draft(trunk_dir, DraftSpec("int8", tuple(range(13))), tmp_path / "new" / "d")
    assert e.value.exit_code == 2 and not (tmp_path / "new").exists()


# ---- damage and other trunks ---------------------------------------------------------------------------------
def flip_byte(d, key, at=100):
    run = next(r for r in manifest(d)["runs"] if r["key"] == key)
    with open(Path(d) / DATA, "r+b") as f:
        f.seek(run["offset"] + at)
        b = f.read(1)
        f.seek(run["offset"] + at)
        f.write(bytes([b[0] ^ 0x40]))


def test_a_flipped_byte_is_caught_by_the_reader_and_by_verify_naming_the_run(trunk_dir, drafts, tmp_path):
    out = shutil.copytree(drafts["int8"], tmp_path / "copy")
    trunk = load_trunk(trunk_dir)
    assert draft_pack.verify_draft(out, trunk) == []
    flip_byte(out, "layer.5")
    draft = open_draft_trunk(out, trunk)
    draft.layer(4)
    with pytest.raises(UnsoundRunError, match=r"block 0 of trunk unit layer\.5 \(.*copy/draft\.bin\) fails"):
        draft.layer(5)
    problems = draft_pack.verify_draft(out, trunk)
    assert len(problems) == 1 and problems[0].startswith("run layer.5:")


def test_a_draft_of_another_trunk_is_refused_naming_both(model_factory, trunk_dir, drafts, tmp_path):
    other = tmp_path / "other"
    pack.pack(model_factory("tiny", 1), other)              # same shapes, other weights
    with pytest.raises(TrunkError, match=f"holds a draft of another trunk: derived from {trunk_dir} .*not from "
                                         f"{other} "):
        open_draft_trunk(drafts["int8"], load_trunk(other))
    assert "another trunk" in draft_pack.verify_draft(drafts["int8"], load_trunk(other))[0]
    mine = shutil.copytree(drafts["int8"], tmp_path / "mine")
    with pytest.raises(TrunkError, match="another trunk.*remove it, or give another --draft-dir") as e:
        draft_pack.derive_draft(other, DraftSpec("int8", tuple(range(13))), mine)
    assert e.value.exit_code == 2 and data(mine) == data(drafts["int8"])


def test_a_stale_draft_inside_a_repacked_trunk_is_replaced(model_factory, trunk_dir, drafts, tmp_path):
    """The default place: TRUNK_DIR/draft-int8 of the checkpoint packed there before is replaced, saying so."""
    t = shutil.copytree(trunk_dir, tmp_path / "T")          # with its drafts (the default place: TRUNK_DIR/draft-*)
    m = manifest(t / "draft-int8")
    m["source"]["directory"] = str(t.resolve())                  # derived from T, as if made there
    (t / "draft-int8" / "manifest.json").write_text(json.dumps(seal(m)))
    pack.pack(model_factory("tiny", 1), t)
    notes = []
    r = draft_pack.derive_draft(t, DraftSpec("int8", tuple(range(13))), say=notes.append)
    assert r.status == "derived" and any("packed in" in n and "replacing it" in n for n in notes)
    open_draft_trunk(t / "draft-int8", load_trunk(t))


def test_a_packed_trunk_is_never_taken_for_a_draft_directory(trunk_dir, tmp_path):
    t = shutil.copytree(trunk_dir, tmp_path / "T")
    before = (t / "manifest.json").read_bytes()
    with pytest.raises(TrunkError, match="not a draft trunk's"):
        draft_pack.derive_draft(t, DraftSpec("int8", (0,)), t)
    assert (t / "manifest.json").read_bytes() == before and load_trunk(t)


def test_an_edited_draft_manifest_is_refused(trunk_dir, drafts, tmp_path):
    out = shutil.copytree(drafts["int8"], tmp_path / "copy")
    m = manifest(out)
    m["runs"][0]["length"] += 1
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(TrunkError, match="not the one k3 pack --draft wrote"):
        open_draft_trunk(out, load_trunk(trunk_dir))


# ---- the command ---------------------------------------------------------------------------------------------
def test_the_command_derives_verifies_and_refuses_bad_input(tiny_model, model_factory, tmp_path, capsys):
    t = tmp_path / "T"
    assert cli([tiny_model, t, "--draft", "int4", "--draft-layers", "0-3,12"]) == 0
    out = capsys.readouterr()
    assert f"{t / 'draft-int4'}: int4 draft of 5 layers and the head" in out.out and "derived layer.12" in out.err
    assert cli([tiny_model, t, "--draft", "int4", "--draft-layers", "0-3,12"]) == 0
    assert "draft-int4 already holds this draft" in capsys.readouterr().err
    assert cli(["--verify", t]) == 0
    assert "int4 draft of 5 of 13 layers and the head" in capsys.readouterr().out
    flip_byte(t / "draft-int4", "layer.12")
    assert cli(["--verify", t, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "run layer.12" in err and f"remove {t / 'draft-int4'}" in err

    foreign = tmp_path / "foreign"
    pack.pack(model_factory("tiny", 1), tmp_path / "other")
    draft_pack.derive_draft(tmp_path / "other", DraftSpec("int8", (0,)), foreign)
    for argv, needle in [([tiny_model, tmp_path / "U", "--draft", "int8", "--draft-layers", "0-13"],
                          "'0-13' names layer 13, but the model has 13 layers"),
                         ([tiny_model, tmp_path / "U", "--draft-layers", "1"], "go with --draft"),
                         ([tiny_model, tmp_path / "U", "--draft", "int8", "--draft-dir", foreign],
                          "holds a draft of another trunk")]:
        code = cli(argv)
        err = capsys.readouterr().err
        assert code == 2 and needle in err, err
    assert not (tmp_path / "U" / "draft-int8").exists()
    with pytest.raises(SystemExit) as e:
        cli([tiny_model, tmp_path / "U", "--draft", "int3"])
    assert e.value.code == 2 and "invalid choice: 'int3'" in capsys.readouterr().err


def test_help_teaches_the_draft(capsys):
    with pytest.raises(SystemExit):
        cli(["--help"])
    text = capsys.readouterr().out
    assert "--draft int8" in text and "--draft-layers 0-45" in text and "DRAFT-TRUNK.md" in text
