"""The lossless trunk codec (`k3 pack --codec planes`): blocks restore to their exact bytes on adversarial
BF16/F32 content, an incompressible block is stored raw, a damaged block is named and never handed on;
a coded pack restores every run's raw bytes, resumes after an interruption, verifies, and gives the raw
trunk's ids and logit bytes at every budget and ring size."""
import json
import shutil

import numpy as np
import pytest

from k3core import EngineConfig, _native, greedy_ids, open_engine
from k3core.errors import TrunkError, UnsoundRunError, UsageError
from k3core.io import codec, pack, trunk_reader
from k3core.files.aligned_io import aligned_buffer
from k3core.io.trunk import CODEC_VERSION, VERSION, load_trunk, open_trunk
from k3core.io.trunk_reader import TrunkReader
from k3core.format.checkpoint import open_checkpoint

from ..conftest import DEMO_MODEL
from .test_pack import Stop, cli, manifest, stop_after

SMALL_BLOCK = 65_536  # blocks of the test packs: a tiny model's layer spans 3-4 (padding to 4096 costs ~3 %)


def checksum_by_definition(data: bytes) -> int:
    """native/planes.h's definition, in numpy: sum of (2i + 1) * word_i mod 2^64, the last word zero-padded."""
    padded = np.frombuffer(data + bytes(-len(data) % 8), "<u8")
    return int((padded * (2 * np.arange(padded.size, dtype=np.uint64) + 1)).sum(dtype=np.uint64)) if padded.size else 0


LENGTHS = [0, 1, 7, 8, 9, 31, 32, 33, 63, 64, 4095, 4096, 65537, (1 << 20) + 5]  # both sides of the vector steps


@pytest.mark.parametrize("n", LENGTHS)
def test_the_native_checksum_is_its_definition(n):
    data = np.random.default_rng(n).bytes(n)
    assert _native.planes_checksum(np.frombuffer(data, np.uint8)) == checksum_by_definition(data)


def test_one_changed_byte_changes_the_checksum():
    data = bytearray(np.random.default_rng(1).bytes(4096))
    base = _native.planes_checksum(np.frombuffer(bytes(data), np.uint8))
    for at in (0, 7, 8, 2049, 4095):
        for delta in (1, 0x80, 0xFF):
            changed = bytearray(data)
            changed[at] ^= delta
            assert _native.planes_checksum(np.frombuffer(bytes(changed), np.uint8)) != base


def planes_by_definition(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """native/planes.h's split, bit by bit: rest = mantissa << 1 | sign (+ an odd block's last byte), exponent."""
    w = [int(raw[2 * j]) | int(raw[2 * j + 1]) << 8 for j in range(raw.size // 2)]
    rest = [(w_ & 0x7F) << 1 | w_ >> 15 for w_ in w] + ([int(raw[-1])] if raw.size % 2 else [])
    return np.array(rest, np.uint8), np.array([w_ >> 7 & 0xFF for w_ in w], np.uint8)


@pytest.mark.parametrize("n", LENGTHS + [4099])
def test_planes_split_and_join_are_the_definition_and_inverse(n):
    raw = np.frombuffer(np.random.default_rng(n).bytes(n), np.uint8)
    rest, exponent = codec.split_planes(raw)
    if n < 70_000:
        want_rest, want_exponent = planes_by_definition(raw)
        assert rest.tobytes() == want_rest.tobytes() and exponent.tobytes() == want_exponent.tobytes()
    out = np.zeros_like(raw)
    got = _native.planes_join(rest, exponent, out)
    assert out.tobytes() == raw.tobytes() and got == checksum_by_definition(raw.tobytes())


def test_planes_join_refuses_wrong_sizes():
    raw = np.frombuffer(np.random.default_rng(2).bytes(4099), np.uint8)
    out = np.zeros_like(raw)
    with pytest.raises(ValueError, match="rest needs 2050 and exponent 2049"):
        _native.planes_join(np.ascontiguousarray(raw[1::2]), np.ascontiguousarray(raw[1::2]), out)


def bf16(values) -> bytes:
    return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()


rng = np.random.default_rng(3)
CONTENTS = {
    "gaussian bf16": bf16(rng.standard_normal(40_000) * 0.02),
    "all equal": bf16(np.full(30_000, 0.5)),
    "all zero": bytes(50_000),
    "all distinct high bytes": np.stack([rng.integers(0, 256, 20_480), np.concatenate(
        [rng.permutation(256) for _ in range(80)])], 1).astype(np.uint8).tobytes(),  # every 256 a permutation
    "NaN and Inf patterns": np.tile(np.array([0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81, 0x0000, 0x8000], "<u2"),
                                    3000).tobytes(),
    "subnormals": (np.arange(20_000) % 0x7F + 1).astype("<u2").tobytes(),
    "f32 norms": (1 + 0.01 * rng.standard_normal(9000)).astype("<f4").tobytes(),
    "odd length": bf16(rng.standard_normal(5001))[:-1],
    "one byte": b"\x7f",
    "random bytes": rng.bytes(33_333),
}


@pytest.mark.parametrize("name", CONTENTS)
def test_every_block_restores_its_exact_bytes(name):
    data = CONTENTS[name]
    blocks, stored = codec.encode_run(data, block=8192)
    assert sum(b.restored for b in blocks) == len(data) and codec.stored_length(blocks) == sum(map(len, stored))
    back = bytearray()
    for b, s in zip(blocks, stored):
        out = bytearray(b.restored)
        codec.restore(b, s[:b.stored], out, f"block of {name}")
        back += out
    assert bytes(back) == data
    kinds = {b.kind for b in blocks}
    if name in ("random bytes", "all distinct high bytes"):
        assert kinds == {codec.RAW}  # nothing to gain: stored as is
    if name == "gaussian bf16":  # sign + ~2.4 bits of exponent: near (8 + 3.4) / 16 of the bytes
        assert kinds == {codec.PLANES} and sum(b.stored for b in blocks) < 0.75 * len(data)
    if name in ("all equal", "all zero"):  # the high plane codes to almost nothing
        assert kinds == {codec.PLANES} and sum(b.stored for b in blocks) < 0.55 * len(data)


@pytest.mark.parametrize("where", ["rest plane", "piece count", "piece table", "code lengths", "stream length",
                                   "piece stream", "raw block"])
def test_a_damaged_block_is_named_never_handed_on(where):
    data = CONTENTS["random bytes" if where == "raw block" else "gaussian bf16"][:8192]
    (b,), (s,) = codec.encode_run(data, block=8192)
    damaged = bytearray(s[:b.stored])
    half = b.restored // 2  # the rest plane's bytes; then the piece count, one (count, size) entry, the piece:
    piece = half + 12       # its exponent range, code lengths, three stream lengths, four streams
    nibbles = (s[piece + 1] - s[piece] + 2) // 2
    damaged[{"rest plane": 10, "piece count": half + 1, "piece table": half + 5, "code lengths": piece + 2,
             "stream length": piece + 2 + nibbles + 1, "piece stream": piece + 2 + nibbles + 12 + 40,
             "raw block": 99}[where]] ^= 0x10
    with pytest.raises(UnsoundRunError, match="block 3 of trunk unit layer.1.*(checksum|decode|piece table)"):
        codec.restore(b, bytes(damaged), bytearray(b.restored), "block 3 of trunk unit layer.1")


def test_a_truncated_block_is_named():
    (b,), (s,) = codec.encode_run(CONTENTS["gaussian bf16"][:8192], block=8192)
    for cut in (4097, 4200, b.stored - 1):  # inside the piece: it ends early
        short = codec.Block(b.offset, cut, b.restored, b.kind, b.checksum)
        with pytest.raises(UnsoundRunError, match="block 0 of trunk unit model does not decode: it has (a block shorter|a damaged "
                                                  "piece table|a stream that ends|stream lengths)"):
            codec.restore(short, s[:cut], bytearray(b.restored), "block 0 of trunk unit model")


def test_a_piece_per_tensor_codes_two_scales_smaller_and_restores_them():
    small, large = bf16(rng.standard_normal(12_000) * 1e-3), bf16(rng.standard_normal(20_000) * 4.0)
    data, cut = small + large, len(small)
    (one,), _ = codec.encode_run(data, block=len(data) + 64)
    (two,), (s,) = codec.encode_run(data, block=len(data) + 64, starts=[cut])
    assert two.kind == codec.PLANES and two.stored < one.stored - 2000  # one code table cannot fit both
    assert int(np.frombuffer(s[len(data) // 2:][:4], "<u4")[0]) == 2
    out = bytearray(two.restored)
    codec.restore(two, s[:two.stored], out, "two tensors")
    assert bytes(out) == data


def test_pieces_are_cut_only_where_both_sides_keep_min_piece_words():
    m = codec.MIN_PIECE
    assert codec.exponent_pieces(10 * m, []) == [(0, 10 * m)]
    assert codec.exponent_pieces(10 * m, [m - 2, 3 * m, 3 * m + 5, 10 * m - 1]) == [(0, 3 * m), (3 * m, 10 * m)]
    assert codec.exponent_pieces(0, [5]) == []


def test_an_unknown_codec_or_block_size_is_a_usage_error(tiny_model, tmp_path):
    with pytest.raises(UsageError, match="'lz4' is not a trunk codec; the codecs are: raw"):
        pack.pack(tiny_model, tmp_path / "t", codec="lz4")
    with pytest.raises(UsageError, match="multiple of 4096"):
        pack.pack(tiny_model, tmp_path / "t", codec="planes", block_bytes=1000)


# ---- packs ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def raw_pack(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("raw") / "trunk"
    pack.pack(tiny_model, out)
    return out


@pytest.fixture(scope="module")
def coded_pack(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("coded") / "trunk"
    pack.pack(tiny_model, out, codec="planes", block_bytes=SMALL_BLOCK)
    return out


def restored_runs(trunk_dir, layers_read=None) -> dict[str, bytes]:
    """Every run's restored bytes read through a TrunkReader; `layers_read` (a list) gets the bytes it read
    from disk for the layer runs."""
    trunk = load_trunk(trunk_dir)
    reader = TrunkReader(trunk)
    try:
        out = {}
        for key, run in trunk.runs.items():
            buf = aligned_buffer(TrunkReader.room(run, 0, run.length))
            at = reader.read(run, 0, run.length, buf)
            out[key] = bytes(buf[at:at + run.length])
            if key == "model" and layers_read is not None:
                layers_read.append(reader.bytes_read)
        return out
    finally:
        reader.close()


def test_a_coded_pack_restores_every_raw_byte_and_is_smaller(tiny_model, raw_pack, coded_pack):
    m = manifest(coded_pack)
    assert (m["version"], m["codec"], m["block_bytes"]) == (CODEC_VERSION, "planes", SMALL_BLOCK)
    coded_read, raw_read = [], []
    assert restored_runs(coded_pack, coded_read) == restored_runs(raw_pack, raw_read)
    assert coded_read[0] < 0.8 * raw_read[0]  # a streamed layer reads its stored bytes, not its restored ones
    assert [r["sha256"] for r in m["runs"]] == [r["sha256"] for r in manifest(raw_pack)["runs"]]
    assert (coded_pack / "trunk.bin").stat().st_size < 0.8 * (raw_pack / "trunk.bin").stat().st_size
    assert pack.verify(coded_pack, tiny_model, deep=True) == []
    open_trunk(coded_pack, open_checkpoint(tiny_model))


@pytest.mark.parametrize("read_bytes, decode_blocks", [(16_384, 1), (trunk_reader.READ_BYTES, trunk_reader.DECODE_BLOCKS)])
@pytest.mark.parametrize("lo, hi", [(0, 1), (65_535, 65_537), (100, 200_000), (65_536, 131_072), (5, 5), (0, 229_472)])
def test_any_range_of_a_coded_run_reads_its_bytes(raw_pack, coded_pack, lo, hi, read_bytes, decode_blocks,
                                                  monkeypatch):
    monkeypatch.setattr(trunk_reader, "READ_BYTES", read_bytes)  # 16 KiB: a read per block
    monkeypatch.setattr(trunk_reader, "DECODE_BLOCKS", decode_blocks)
    want = restored_runs(raw_pack)["layer.1"][lo:hi]
    trunk = load_trunk(coded_pack)
    reader = TrunkReader(trunk)
    try:
        run = trunk.runs["layer.1"]
        buf = aligned_buffer(max(1, TrunkReader.room(run, lo, hi)))
        assert reader.read(run, lo, hi, buf) == 0 and bytes(buf[:hi - lo]) == want
        assert reader.read_bytes(run, lo, hi - lo) == want
        assert TrunkReader.room(run, lo, hi) <= trunk_reader.room_for(trunk, hi - lo)
        if hi - lo > 2 * trunk.block_bytes:
            with pytest.raises(TrunkError, match="cannot restore bytes .* in place; it needs"):
                reader.read(run, lo, hi, aligned_buffer(hi - lo))
    finally:
        reader.close()


def test_hashing_a_coded_run_in_chunks_shorter_than_it_restores_in_place(raw_pack, coded_pack):
    import hashlib

    want = restored_runs(raw_pack)["layer.1"]
    trunk = load_trunk(coded_pack)
    reader = TrunkReader(trunk)
    try:  # three blocks per chunk: each is restored in place, in a buffer room_for sized
        got = trunk_reader.restored_sha256(reader, trunk.runs["layer.1"], chunk=3 * trunk.block_bytes)
    finally:
        reader.close()
    assert got == hashlib.sha256(want).hexdigest()


def synthetic_coded_run(tmp_path, contents: list[bytes], block: int):
    """A coded run of `contents` (one block each) written to its own trunk.bin, with the Trunk and Run fields a
    TrunkReader uses."""
    from types import SimpleNamespace

    data = b"".join(contents)
    blocks, stored = codec.encode_run(data, block=block)
    path = tmp_path / "trunk.bin"
    path.write_bytes(b"".join(stored))
    trunk = SimpleNamespace(path=path, codec=codec.PLANES, block_bytes=block)
    return trunk, SimpleNamespace(key="layer.7", offset=0, length=len(data), blocks=tuple(blocks), codec=codec.PLANES), data


@pytest.mark.parametrize("decode_blocks", [1, 3])
@pytest.mark.parametrize("lo, hi", [(0, None), (1000, None), (8192 + 5, -77)])
def test_in_place_restores_never_overwrite_a_block_not_yet_restored(tmp_path, monkeypatch, decode_blocks, lo, hi):
    """The worst order for the in-place restore: blocks that store almost nothing (their restored bytes race
    ahead) before blocks stored raw (their stored bytes are as long as the restored ones)."""
    monkeypatch.setattr(trunk_reader, "DECODE_BLOCKS", decode_blocks)
    monkeypatch.setattr(trunk_reader, "READ_BYTES", 3 * 8192)
    noise = np.random.default_rng(9).bytes
    contents = [bytes(8192)] * 12 + [noise(8192) for _ in range(10)] + [bf16(rng.standard_normal(4096))] * 3
    trunk, run, data = synthetic_coded_run(tmp_path, contents, 8192)
    assert {b.kind for b in run.blocks} == {codec.RAW, codec.PLANES}
    hi = len(data) + hi if hi else len(data)
    reader = TrunkReader(trunk)
    try:
        buf = aligned_buffer(TrunkReader.room(run, lo, hi))
        assert reader.read(run, lo, hi, buf) == 0 and bytes(buf[:hi - lo]) == data[lo:hi]
    finally:
        reader.close()


def test_packing_again_does_nothing_and_another_codec_repacks(tiny_model, coded_pack, tmp_path):
    out = shutil.copytree(coded_pack, tmp_path / "copy")
    assert pack.pack(tiny_model, out, codec="planes", block_bytes=SMALL_BLOCK).status == "up-to-date"
    notes = []
    assert pack.pack(tiny_model, out, say=notes.append).status == "packed"
    assert manifest(out)["version"] == VERSION and "codec" not in manifest(out)


def test_an_interrupted_coded_pack_resumes_to_the_same_bytes(tiny_model, coded_pack, tmp_path):
    out = tmp_path / "trunk"
    with pytest.raises(Stop):
        pack.pack(tiny_model, out, progress=stop_after(4), codec="planes", block_bytes=SMALL_BLOCK)
    state = json.loads((out / pack.STATE).read_text())
    assert [d["key"] for d in state["done"]] == ["layer.0", "layer.1", "layer.2", "layer.3"]
    last = state["done"][-1]
    with open(out / pack.PARTIAL, "r+b") as f:  # a torn last run: its stored hash no longer matches
        f.seek(last["offset"] + 16)
        f.write(b"\xab" * 64)
    notes = []
    r = pack.pack(tiny_model, out, say=notes.append, codec="planes", block_bytes=SMALL_BLOCK)
    assert r.status == "resumed" and r.runs_copied == r.runs - 3
    assert any("layer.3" in n and "torn" in n for n in notes)
    assert (out / "trunk.bin").read_bytes() == (coded_pack / "trunk.bin").read_bytes()
    assert manifest(out) == manifest(coded_pack)


@pytest.mark.parametrize("edit, says", [
    (lambda m: m.update(codec="lz4"), "names codec 'lz4', which this k3 does not know"),
    (lambda m: m.pop("codec"), f"version {CODEC_VERSION} is not one this k3 reads"),
    (lambda m: m.update(version=3), "version 3 is not one this k3 reads.*re-pack"),  # the zstd-coded format
    (lambda m: m["runs"][1]["blocks"][0].__setitem__(3, "rle"), "impossible block entry"),
    (lambda m: m["runs"][1]["blocks"][1].__setitem__(0, 4096 * 999), "blocks do not restore exactly"),
    (lambda m: m.update(block_bytes=1000), "block_bytes 1000 is not a positive multiple"),
])
def test_a_damaged_coded_manifest_is_refused_naming_what(coded_pack, tmp_path, edit, says):
    from k3core.errors import TrunkError

    out = shutil.copytree(coded_pack, tmp_path / "copy")
    m = manifest(out)
    edit(m)
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(TrunkError, match=says) as e:
        load_trunk(out)
    assert "manifest.json" in str(e.value)


def flip_stored_byte(trunk_dir, key, block=2, at=30):
    run = next(r for r in manifest(trunk_dir)["runs"] if r["key"] == key)
    with open(trunk_dir / "trunk.bin", "r+b") as f:
        f.seek(run["offset"] + run["blocks"][block][0] + at)
        b = f.read(1)
        f.seek(run["offset"] + run["blocks"][block][0] + at)
        f.write(bytes([b[0] ^ 0x04]))


def test_verify_names_the_damaged_block(tiny_model, coded_pack, tmp_path, capsys):
    out = shutil.copytree(coded_pack, tmp_path / "copy")
    assert cli(["--verify", out]) == 0 and "planes codec" in capsys.readouterr().out
    flip_stored_byte(out, "layer.5")
    problems = pack.verify(out)
    assert len(problems) == 1 and "run layer.5" in problems[0] and "block 2 of trunk unit layer.5" in problems[0]
    assert cli(["--verify", out]) == 2 and "block 2 of trunk unit layer.5" in capsys.readouterr().err


# ---- the engine on a coded pack ------------------------------------------------------------------------------
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
CONFIGS = {"pinned 0, ring 2": dict(pin_layers=0, ring=2, expert_store="direct"),
           "pinned 3, ring 3": dict(pin_layers=3, ring=3),
           "pinned all, head streamed": dict(pin_layers=99, placer_options={"pin_head": False}),
           "pinned all and head": dict(pin_layers=99),
           "3 held coded, ring 2": dict(pin_layers=3, ring=2, placer_options={"pin_coded": True}),
           "all held coded, head pinned": dict(pin_layers=99, placer_options={"pin_coded": True, "pin_head": True})}


def run(model, trunk, **fields):
    with open_engine(EngineConfig(model, trunk=trunk, **fields)) as engine:
        ids, logits = greedy_ids(engine, PROMPT, 5)
        return ids, logits.view(np.uint32).tobytes(), engine.stats()


@pytest.mark.parametrize("model", ["tiny", "demo"])
def test_a_coded_trunk_gives_the_raw_trunk_s_ids_and_logit_bytes(model, model_factory, tmp_path, monkeypatch):
    monkeypatch.setattr(trunk_reader, "READ_BYTES", 65_536)  # layers restore through several reads
    monkeypatch.setattr(trunk_reader, "DECODE_BLOCKS", 2)
    path = DEMO_MODEL if model == "demo" else model_factory(model)
    raw, coded = tmp_path / "raw", tmp_path / "coded"
    pack.pack(path, raw)
    pack.pack(path, coded, codec="planes", block_bytes=SMALL_BLOCK)
    for name, cfg in CONFIGS.items():
        a, b = run(path, raw, **cfg), run(path, coded, **cfg)
        assert a[:2] == b[:2], name
        assert b[2]["trunk_codec"] == "planes" and a[2]["trunk_codec"] == "raw"
    assert run(path, coded, **CONFIGS["pinned 0, ring 2"])[2]["trunk_decode_seconds"] > 0
    held = run(path, coded, **CONFIGS["3 held coded, ring 2"])[2]
    assert held["pinned_coded"] and held["pinned_layers"] == 3


def test_held_coded_layers_pin_more_per_gigabyte_and_read_nothing_per_token(model_factory, tmp_path):
    from k3core import memory_plan

    path = model_factory("medium")
    coded = tmp_path / "coded"
    pack.pack(path, coded, codec="planes", block_bytes=SMALL_BLOCK)
    trunk = load_trunk(coded)
    plain = {r.item: r for r in memory_plan(EngineConfig(path, trunk=coded, pin_layers=6,
                                                           placer_options={"pin_coded": False})).rows}
    held = {r.item: r for r in memory_plan(EngineConfig(path, trunk=coded, pin_layers=6,
                                                          placer_options={"pin_coded": True})).rows}
    assert held["pinned trunk"].bytes == sum(trunk.layer(L).span for L in range(6)) < plain["pinned trunk"].bytes
    assert "held as planes blocks" in held["pinned trunk"].detail
    budget = plain["pinned trunk"].bytes / 1e9 + plain["trunk ring"].bytes / 1e9 + 1e-6  # 6 layers as raw pins
    fit = {name: run(path, coded, trunk_gb=budget, placer_options=options)[2]
           for name, options in (("default", None), ("held", {"pin_coded": True}))}
    assert fit["default"]["pinned_layers"] == 6 and not fit["default"]["pinned_coded"]  # by default: restored
    assert fit["held"]["pinned_layers"] > 6 and fit["held"]["pinned_coded"]
    every = {r.item: r for r in memory_plan(EngineConfig(path, trunk=coded, trunk_gb=10)).rows}
    assert "held" not in every["pinned trunk"].detail  # when everything fits restored, nothing is held coded
    read = {}
    for name, options in (("raw pins", {"pin_head": True}), ("held", {"pin_coded": True, "pin_head": True})):
        with open_engine(EngineConfig(path, trunk=coded, pin_layers=99, placer_options=options)) as engine:
            before = engine.stats()["trunk_bytes_read"]
            greedy_ids(engine, PROMPT, 3)
            read[name] = engine.stats()["trunk_bytes_read"] - before
    assert read["held"] == read["raw pins"]  # embedding rows only: every held layer is restored from RAM, not read


def test_the_memory_plan_counts_the_codec_scratch_and_the_in_place_slots(tiny_model, coded_pack):
    from k3core import memory_plan

    rows = {r.item: r.bytes for r in memory_plan(EngineConfig(tiny_model, trunk=coded_pack, pin_layers=0)).rows}
    trunk = load_trunk(coded_pack)
    assert rows["trunk codec scratch"] == trunk_reader.scratch_bytes(trunk)
    biggest = max(TrunkReader.room(r, 0, r.length) for k, r in trunk.runs.items() if k.startswith("layer."))
    assert rows["trunk ring"] == 2 * biggest  # each slot restores its layer in place: its bytes + slack


def test_a_damaged_block_mid_run_ends_the_run_with_exit_4(tiny_model, coded_pack, tmp_path, capsys):
    from k3core.cli.main import main

    out = shutil.copytree(coded_pack, tmp_path / "copy")
    flip_stored_byte(out, "layer.4", block=1)
    code = main(["run", str(tiny_model), "--trunk", str(out), "--pin-layers", "0", "--ids", "1,2,3",
                 "--max-tokens", "3"])
    err = capsys.readouterr().err
    assert code == 4 and "block 1 of trunk unit layer.4" in err and "checksum" in err


def test_pages_a_buffer_gives_back_are_freed():
    """A pinned coded layer gives its in-place slack back with madvise(MADV_DONTNEED): in private memory the
    pages are freed (they read back as zeros); in Python's default shared mapping they would stay allocated,
    uncounted by RSS, with their bytes."""
    import mmap

    buf = aligned_buffer(8 << 20)
    buf[:] = b"\x01" * len(buf)
    buf.madvise(mmap.MADV_DONTNEED, 4 << 20, 4 << 20)
    assert buf[:4 << 20] == b"\x01" * (4 << 20) and buf[4 << 20:] == bytes(4 << 20)


@pytest.mark.parametrize("kind, cfg", [("raw", dict(pin_layers=0)), ("raw", dict(pin_layers=3)),
                                       ("raw", dict(pin_layers=99)), ("coded", dict(pin_layers=3)),
                                       ("coded", dict(pin_layers=3, placer_options={"pin_coded": True}))])
def test_streamed_bytes_is_what_one_more_pass_reads(tiny_model, raw_pack, coded_pack, kind, cfg):
    """The placer's streamed_bytes (what `--prefill-chunk auto` weighs) against its own read counter: two passes
    less one, each engine closed first so that no read-ahead is still in flight. The second pass embeds the same ids,
    whose rows the placer kept from the first (EMBED_ROWS_KEPT): it reads the streamed trunk alone."""
    from k3core.plugins.pinned import PinnedPlacer

    trunk = raw_pack if kind == "raw" else coded_pack
    config = EngineConfig(tiny_model, trunk=trunk, expert_store="direct", **cfg)
    read = []
    for passes in (1, 2):
        with open_engine(config) as engine:
            state = engine.new_state()
            for _ in range(passes):
                engine.forward(PROMPT, state)
            placer = engine.placer
        read.append(placer.stats()["trunk_bytes_read"])
    streamed = PinnedPlacer.streamed_bytes(placer.ctx)
    assert read[1] - read[0] == streamed and (streamed == 0) == (cfg["pin_layers"] == 99)
