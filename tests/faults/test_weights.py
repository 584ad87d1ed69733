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
