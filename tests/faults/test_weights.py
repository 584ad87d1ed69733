"""Weight bytes that changed on disk after they were packed or recorded: every one is caught where it is read —
exit 4 naming the file and the block, never a token. Each row flips one bit of one tensor in a copy of a packed
trunk and runs `k3 run` in a configuration that reads that tensor from the pack."""
from __future__ import annotations

import shutil

import pytest

from k3core.cli.main import main
from k3core.io.pack import pack
from k3core.io.trunk import load_trunk

HEAD, EMBED, NORM = "language_model.lm_head.weight", "language_model.model.embed_tokens.weight", \
    "language_model.model.norm.weight"


@pytest.fixture(scope="module")
def packs(tiny_model, tmp_path_factory):
    out = {}
    for codec in ("raw", "planes"):
        out[codec] = tmp_path_factory.mktemp("pack") / codec
        pack(tiny_model, out[codec], codec=codec)
    return out


def flip(trunk_dir, key: str, tensor: str, at: float = 0.5) -> int:
    """Flip one bit of `tensor` in run `key` of a raw pack, `at` of the way into it; returns the block hit."""
    trunk = load_trunk(trunk_dir)
    run = trunk.runs[key]
    t = next(t for t in run.tensors if t.name == tensor)
    offset = t.offset + int(t.nbytes * at)
    with open(trunk.path, "r+b") as f:
        f.seek(run.offset + offset)
        byte = f.read(1)[0]
        f.seek(run.offset + offset)
        f.write(bytes([byte ^ 0x10]))
    return offset // trunk.block_bytes


# (run key, tensor, how the run reads it)
RAW_ROWS = [
    ("model", HEAD, ["--pin-layers", "99"]),                      # lm_head pinned: loaded once, checked then
    ("model", HEAD, ["--pin-layers", "99", "--placer-option", "pin_head=false"]),  # lm_head streamed in row blocks
    ("model", HEAD, ["--pin-layers", "0"]),
    ("model", NORM, ["--pin-layers", "99"]),                      # a small model-level tensor
    ("model", EMBED, ["--pin-layers", "99"]),                     # embedding rows, read per token
    ("layer.1", "self_attn.q_proj.weight", ["--pin-layers", "0"]),  # a streamed layer
    ("layer.0", "input_layernorm.weight", ["--pin-layers", "1"]),   # a pinned layer
    ("layer.2", "block_sparse_moe.gate.weight", ["--pin-layers", "1", "--ring", "3"]),  # the router
]


@pytest.mark.parametrize("key, tensor, flags", RAW_ROWS, ids=[f"{k}:{t.split('.')[-2]}:{' '.join(f)}"
                                                              for k, t, f in RAW_ROWS])
def test_a_flipped_bit_in_a_raw_pack_stops_the_run_naming_the_block(packs, tiny_model, tmp_path, capsys, key, tensor,
                                                                    flags):
    copy = shutil.copytree(packs["raw"], tmp_path / "t")
    at = 0.0 if tensor == EMBED else 0.5  # id 1's row is at the start of the embedding
    block = flip(copy, key, tensor, at)
    code = main(["run", str(tiny_model), "--trunk", str(copy), "--ids", "0,1,2", "--gen", "3", *flags])
    err = capsys.readouterr().err
    assert code == 4, err
    assert f"block {block} of trunk unit {key}" in err and "checksum" in err and str(copy / "trunk.bin") in err
    assert "Traceback" not in err


def test_the_intact_pack_runs_with_every_flag_set(packs, tiny_model, capsys):
    """The rows above fail only because of the flipped bit."""
    for flags in {tuple(f) for _, _, f in RAW_ROWS}:
        assert main(["run", str(tiny_model), "--trunk", str(packs["raw"]), "--ids", "0,1,2", "--gen", "3", *flags]) == 0


def test_pack_verify_names_the_flipped_block(packs, tmp_path, capsys):
    copy = shutil.copytree(packs["raw"], tmp_path / "t")
    block = flip(copy, "layer.1", "self_attn.q_proj.weight")
    assert main(["pack", "--verify", str(copy)]) != 0
    assert f"run layer.1: block {block} fails its checksum" in capsys.readouterr().err


# ---- the checkpoint itself: every tensor against the checksums recorded for it (k3-tensor-sums.bin) ----------
def flip_tensor(model, name: str) -> None:
    from k3core.format.checkpoint import open_checkpoint

    ckpt = open_checkpoint(model)
    info = ckpt.index[name]
    ckpt.close()
    with open(info.file, "r+b") as f:
        f.seek(info.offset + info.nbytes // 2)
        byte = f.read(1)[0]
        f.seek(info.offset + info.nbytes // 2)
        f.write(bytes([byte ^ 0x01]))


def every_expert(model, layer: int, part: str) -> list[str]:
    from k3core.format.checkpoint import expert_prefix, open_checkpoint

    ckpt = open_checkpoint(model)
    ckpt.close()
    return [expert_prefix(layer, e) + part for e in range(ckpt.config.num_experts)]


# (what to flip, flags): an expert read by each store, and a trunk tensor the resident placer loads
CHECKPOINT_ROWS = [
    ("experts of layer 2: w1.weight_packed", ["--expert-store", "lru"]),
    ("experts of layer 2: w2.weight_scale", ["--expert-store", "direct"]),
    ("experts of layer 1: w3.weight_packed", ["--expert-store", "lru", "--cache-gb", "0"]),
    ("trunk: language_model.model.layers.3.self_attn.o_proj.weight", []),
    ("trunk: language_model.lm_head.weight", []),
]


@pytest.mark.parametrize("what, flags", CHECKPOINT_ROWS, ids=[w for w, _ in CHECKPOINT_ROWS])
def test_a_flipped_bit_in_the_checkpoint_stops_the_run_naming_the_tensor(tiny_model, tmp_path, capsys, what, flags):
    model = shutil.copytree(tiny_model, tmp_path / "m")
    if what.startswith("experts"):
        layer, part = int(what.split()[3].rstrip(":")), what.split(": ")[1]
        names = every_expert(model, layer, part)
    else:
        names = [what.split(": ")[1]]
    for name in names:
        flip_tensor(model, name)
    code = main(["run", str(model), "--ids", "0,1,2", "--gen", "3", *flags])
    err = capsys.readouterr().err
    assert code == 4, err
    assert any(f"tensor {n} fails its checksum" in err for n in names) and str(model) in err
    assert "Traceback" not in err


def test_a_checkpoint_without_recorded_checksums_is_refused_naming_the_command(tiny_model, tmp_path, capsys):
    model = shutil.copytree(tiny_model, tmp_path / "m")
    (model / "k3-tensor-sums.bin").unlink()
    assert main(["run", str(model), "--ids", "0,1", "--gen", "1"]) == 2
    assert "k3-tensor-sums.bin" in (err := capsys.readouterr().err) and "k3 verify" in err


@pytest.mark.parametrize("damage", ["truncated", "a byte changed", "another shard's header"])
def test_a_damaged_or_stale_checksum_file_is_refused(tiny_model, tmp_path, capsys, damage):
    from k3core.format.scan import record_tensor_sums

    model = shutil.copytree(tiny_model, tmp_path / "m")
    sums = model / "k3-tensor-sums.bin"
    if damage == "truncated":
        sums.write_bytes(sums.read_bytes()[:-5])
    elif damage == "a byte changed":
        raw = bytearray(sums.read_bytes())
        raw[len(raw) // 2] ^= 1
        sums.write_bytes(bytes(raw))
    else:  # recorded for another checkpoint whose first shard has another header
        other = shutil.copytree(tiny_model, tmp_path / "o")
        shard = sorted(other.glob("*.safetensors"))[0]
        raw = bytearray(shard.read_bytes())
        raw[raw.index(b'"pt"') + 1] = ord("P")  # the metadata's "pt" -> "Pt": same size, another header
        shard.write_bytes(bytes(raw))
        record_tensor_sums(other)
        shutil.copy(other / "k3-tensor-sums.bin", sums)
    assert main(["run", str(model), "--ids", "0,1", "--gen", "1"]) == 2
    err = capsys.readouterr().err
    assert ("damaged" in err if damage != "another shard's header" else "has changed since" in err), err
    assert "k3 verify" in err


def test_running_sums_in_pieces_equal_one_checksum():
    import numpy as np

    from k3core import _native
    from k3core.format.tensor_sums import RunningSum

    data = np.random.default_rng(0).integers(0, 256, 10_007, dtype=np.uint8).tobytes()
    for cuts in ([], [8, 16], [3, 5, 4099], [1, 2, 3, 9999], list(range(1, 10_007, 777))):
        running, at = RunningSum(), 0
        for c in cuts + [len(data)]:
            running.update(data[at:c])
            at = c
        assert running.value() == _native.planes_checksum(np.frombuffer(data, np.uint8))


def test_sums_from_a_hash_pass_equal_sums_from_reading_each_tensor(tiny_model, tmp_path):
    """ShardSums fed a shard's bytes front to back in odd pieces (as `k3 setup` hashes it) records the same file."""
    from k3core.format.scan import record_tensor_sums
    from k3core.format.tensor_sums import ShardSums

    model = shutil.copytree(tiny_model, tmp_path / "m")
    want = (model / "k3-tensor-sums.bin").read_bytes()
    (model / "k3-tensor-sums.bin").unlink()
    known = {}
    for i, shard in enumerate(sorted(model.glob("*.safetensors"))):
        sums, data = ShardSums(shard), shard.read_bytes()
        for at in range(0, len(data), 777 + i):
            sums.update(data[at:at + 777 + i])
        known[shard] = sums
    record_tensor_sums(model, known=known)
    assert (model / "k3-tensor-sums.bin").read_bytes() == want


def test_experts_with_scale_bytes_of_255_are_counted_and_named(tiny_model):
    """MODEL.md §5: a scale byte of 255 reads its group as zero, and is counted: recorded with the checksums, named in
    the run report for each expert read that has one (the test model plants one in expert 1's w2)."""
    from k3core.files.aligned_io import aligned_buffer
    from k3core.io.expert_io import ExpertReader, expert_slot_bytes
    from k3core.format.checkpoint import open_checkpoint
    from k3core.report.run import _nan_scale_line

    ckpt = open_checkpoint(tiny_model)
    layer = max(1, ckpt.config.first_k_dense_replace)
    reader, buf = ExpertReader(ckpt), aligned_buffer(expert_slot_bytes(ckpt))
    try:
        reader.read([(layer, 0, buf)])
        assert reader.nan_scales == {}
        reader.read([(layer, 1, buf)])
        assert reader.nan_scales == {(layer, 1): 1}
    finally:
        reader.close()
        ckpt.close()
    assert _nan_scale_line({"expert_nan_scales": [[layer, 1, 1]]}) == [
        f"MXFP4 scale byte 255 (NaN in the OCP spec) in 1 group(s) of 1 expert(s) read, each group read as zero "
        f"(MODEL.md §5): layer {layer} expert 1 (1)"]


def test_sums_from_a_hash_pass_are_used_whatever_the_path_given(tiny_model, tmp_path, monkeypatch):
    """A relative checkpoint path (`k3 verify demo-model`) still finds the shards the hash pass fed."""
    from k3core.format.scan import record_tensor_sums
    from k3core.format.tensor_sums import ShardSums
    from k3core.format import tensor_sums

    model = shutil.copytree(tiny_model, tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    known = {}
    for shard in sorted(model.glob("*.safetensors")):
        known[shard.relative_to(tmp_path)] = sums = ShardSums(shard)
        sums.update(shard.read_bytes())
    monkeypatch.setattr(tensor_sums, "_read_through", lambda *a: pytest.fail("a fed shard was read again"))
    record_tensor_sums("m", known=known)
