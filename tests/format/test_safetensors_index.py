"""ShardIndex against the k3-in-c edge-case shards (values decoded here with struct, independently of
the index) and against hand-built bad directories, each under both header layouts: the compact one
safetensors writes (numpy path) and a spaced one (json path)."""
import hashlib
import json
import math
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from k3core.format import header_scan as scan
from k3core.format import safetensors_index as si
from k3core.errors import CheckpointError
from k3core.format.safetensors_index import DTYPES, ShardIndex

ST = Path(__file__).parents[1] / "fixtures" / "k3-in-c" / "st"
SHARD1, SHARD2 = ST / "model-00001-of-00002.safetensors", ST / "model-00002-of-00002.safetensors"
WEIRD = 'weird\\name."with"quotes'
EXPECTED = {   # name: (shard, dtype, shape), read off the fixture headers by hand
    "plain.f32.2d": (SHARD1, "F32", (16, 16)),
    "plain.bf16.1d": (SHARD1, "BF16", (128,)),
    "tricky.f16.1d": (SHARD1, "F16", (64,)),
    "packed.u8.2d": (SHARD1, "U8", (7, 32)),
    "scalar.f32": (SHARD1, "F32", ()),
    "empty.f32": (SHARD1, "F32", (0, 8)),
    "language_model.model.layers.0.block_sparse_moe.experts.0.w1.weight_packed": (SHARD1, "U8", (2, 32)),
    "language_model.model.layers.0.block_sparse_moe.experts.1.w1.weight_packed": (SHARD1, "U8", (2, 32)),
    "rank3.f32": (SHARD1, "F32", (2, 3, 4)),
    "rank4.u8": (SHARD1, "U8", (2, 2, 2, 2)),
    "second.shard.f32": (SHARD2, "F32", (10, 10)),
    "second.shard.u8": (SHARD2, "U8", (300,)),
    WEIRD: (SHARD2, "F32", (3,)),
}


# ---- an independent reader: struct and json only ------------------------------------------------
def raw_header(path):
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return n, json.loads(data[8:8 + n]), data


def struct_values(path, name):
    """(dtype, shape, flat list of Python values) decoded with struct; BF16 as its uint16 bits."""
    n, header, data = raw_header(path)
    e = header[name]
    b, end = e["data_offsets"]
    raw = data[8 + n + b:8 + n + end]
    fmt = {"F32": "f", "F16": "e", "BF16": "H", "U8": "B"}[e["dtype"]]
    return e["dtype"], tuple(e["shape"]), list(struct.unpack(f"<{len(raw) // struct.calcsize(fmt)}{fmt}", raw))


def bf16_to_float(bits):
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


@pytest.fixture(scope="module")
def fixture_index():
    with ShardIndex.open(ST) as index:
        yield index


# ---- the k3-in-c fixture ----------------------------------------------------------------------------
def test_every_fixture_tensor_is_indexed_with_its_file_dtype_and_shape(fixture_index):
    assert len(fixture_index) == len(EXPECTED)
    assert set(fixture_index.names()) == set(EXPECTED)
    for name, (path, dtype, shape) in EXPECTED.items():
        info = fixture_index[name]
        assert (info.name, info.file, info.dtype, info.shape) == (name, path.resolve(), dtype, shape)
        assert info.nbytes == math.prod(shape) * DTYPES[dtype][0]


def test_metadata_is_skipped_not_indexed(fixture_index):
    assert "__metadata__" in raw_header(SHARD1)[1]
    assert "__metadata__" not in fixture_index


def test_offsets_are_absolute_even_when_the_data_region_is_unaligned(fixture_index):
    for path in (SHARD1, SHARD2):
        n, header, _ = raw_header(path)
        assert (8 + n) % 8 != 0                  # the fixture's point: data does not start on 8 bytes
        for name, e in header.items():
            if name != "__metadata__":
                assert fixture_index[name].offset == 8 + n + e["data_offsets"][0]


def test_shard_files_record_size_header_length_and_header_sha256(fixture_index):
    assert [f.path for f in fixture_index.files] == [SHARD1.resolve(), SHARD2.resolve()]
    for f in fixture_index.files:
        data = f.path.read_bytes()
        n = struct.unpack("<Q", data[:8])[0]
        assert (f.size, f.header_len, f.header_sha256) == (len(data), n, hashlib.sha256(data[8:8 + n]).hexdigest())


def test_every_value_read_matches_struct_decoding_bit_for_bit(fixture_index):
    for name, (path, _, _) in EXPECTED.items():
        n, header, data = raw_header(path)
        begin, end = header[name]["data_offsets"]
        span = data[8 + n + begin:8 + n + end]
        dtype, shape, want = struct_values(path, name)
        got = fixture_index.read(name)
        assert got.shape == shape and got.dtype == DTYPES[dtype][1] and not got.flags.writeable
        assert got.tobytes() == span == fixture_index.read_bytes(name)             # bits, NaN payloads included
        for g, w in zip(got.ravel().tolist(), want, strict=True):                   # and values, decoded apart
            assert g == w or (math.isnan(g) and math.isnan(w))
            assert math.copysign(1, g) == math.copysign(1, w)


def test_bf16_keeps_raw_bits_for_infinities_nan_and_negative_zero(fixture_index):
    bits = fixture_index.read("plain.bf16.1d").tolist()
    values = [bf16_to_float(b) for b in bits[:6]]
    assert values[0] == math.inf and values[1] == -math.inf and math.isnan(values[2])
    assert values[3] == 0.0 and math.copysign(1, values[3]) == 1
    assert values[4] == 0.0 and math.copysign(1, values[4]) == -1
    assert values[5] == 2.0**-126                # 0x0080, the smallest normal
    assert bits[:6] == [0x7F80, 0xFF80, 0x7FC0, 0x0000, 0x8000, 0x0080]


def test_f16_subnormals_and_specials_read_exactly(fixture_index):
    v = fixture_index.read("tricky.f16.1d").astype(np.float64).tolist()
    assert v[0] == math.inf and v[1] == -math.inf and math.isnan(v[2])
    assert math.copysign(1, v[3]) == 1 and math.copysign(1, v[4]) == -1
    assert v[5] == 2.0**-24 and v[6] == 1023 * 2.0**-24 and v[7] == 2.0**-14   # min and max subnormal, min normal


def test_scalar_empty_u8_and_high_rank_tensors_have_their_shapes(fixture_index):
    assert fixture_index.read("scalar.f32").shape == () and float(fixture_index.read("scalar.f32")) == 3.5
    empty = fixture_index.read("empty.f32")
    assert empty.shape == (0, 8) and fixture_index["empty.f32"].nbytes == 0
    u8 = fixture_index.read("packed.u8.2d")
    assert u8.shape == (7, 32) and u8.tobytes() == bytes(struct_values(SHARD1, "packed.u8.2d")[2])
    assert fixture_index.read("rank3.f32")[1, 2, 3] == struct_values(SHARD1, "rank3.f32")[2][23]
    assert fixture_index.read("rank4.u8")[1, 0, 1, 0] == struct_values(SHARD1, "rank4.u8")[2][10]


def test_name_with_quotes_and_backslash_in_the_second_shard(fixture_index):
    assert fixture_index[WEIRD].file == SHARD2.resolve()
    assert fixture_index.read(WEIRD).tolist() == [1.0, 2.0, 3.0]
    assert fixture_index.read("second.shard.u8").tolist() == struct_values(SHARD2, "second.shard.u8")[2]


def test_absent_tensor_raises_checkpoint_error_naming_tensor_and_directory(fixture_index):
    with pytest.raises(CheckpointError, match=r"no such tensor") as e:
        fixture_index["nope.weight"]
    assert e.value.tensor == "nope.weight" and str(ST.resolve()) in str(e.value)
    assert "nope.weight" not in fixture_index


def test_open_reads_only_the_length_and_header_of_each_shard(monkeypatch):
    reads, real_pread, real_preadv = [], os.pread, os.preadv

    def pread(fd, n, off):
        reads.append((os.readlink(f"/proc/self/fd/{fd}"), off, n))
        return real_pread(fd, n, off)

    def preadv(fd, buffers, off):
        reads.append((os.readlink(f"/proc/self/fd/{fd}"), off, sum(len(b) for b in buffers)))
        return real_preadv(fd, buffers, off)

    monkeypatch.setattr(os, "pread", pread)
    monkeypatch.setattr(os, "preadv", preadv)
    monkeypatch.setattr(si.mmap, "mmap", None)  # mapping a shard during open would fail
    ShardIndex.open(ST)
    limit = {str(p.resolve()): 8 + raw_header(p)[0] for p in (SHARD1, SHARD2)}
    assert {f for f, _, _ in reads} == set(limit)
    assert all(off + n <= limit[f] for f, off, n in reads)


# ---- the two parsers agree ------------------------------------------------------------------------
def compact(header):
    """A header laid out as the safetensors library writes it: compact JSON, space-padded to 8."""
    raw = json.dumps(header, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)


def as_columns(t):
    return [t.name(i) for i in range(len(t.start))], [t.kinds[k] for k in t.kind], t.begin.tolist(), t.end.tolist()


def test_compact_parser_matches_json_parser_on_the_fixture_headers():
    for path in (SHARD1, SHARD2):
        header = raw_header(path)[1]
        plain = {k: v for k, v in header.items() if "\\" not in json.dumps(k)}   # no escapes: compact path
        raw = compact(plain)
        fast = scan.parse_compact(bytearray(raw + bytes(64)), len(raw))
        assert fast is not None
        assert as_columns(fast) == as_columns(si._parse_json(raw, path))


@pytest.mark.parametrize("header", [
    {"a\\b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},          # escape in a name
    {"a": {"shape": [1], "dtype": "F32", "data_offsets": [0, 4]}},             # other key order
    {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 1}},    # extra key
    {"é": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},             # non-ASCII name
    {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 10**17]}},       # 18 digits
    {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},              # metadata not first, and
     "__metadata__": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},  # shaped like an entry
])
def test_compact_parser_declines_what_it_does_not_fully_check(header):
    raw = compact(header)
    assert scan.parse_compact(bytearray(raw + bytes(64)), len(raw)) is None


def test_fingerprint_of_a_span_does_not_depend_on_its_batch():
    buf = bytearray(b"language_model.lm_head.weight|ab|ab|language_model.model.embed_tokens.weight" + bytes(8))
    words = scan.word_view(buf)
    start, stop = np.array([0, 30, 33, 36]), np.array([29, 32, 35, 76])
    together = scan.fingerprints(words, start, stop)
    alone = np.concatenate([scan.fingerprints(words, start[i:i + 1], stop[i:i + 1]) for i in range(4)], axis=1)
    assert (together == alone).all()
    assert (together[:, 1] == together[:, 2]).all() and len({tuple(c) for c in together.T}) == 3


def test_numbers_parse_up_to_sixteen_digits_and_refuse_leading_zeros():
    text = b'"data_offsets":[0,7,1234567890123456,99999999,100000000,05]'
    buf = bytearray(text + bytes(16))
    a, words = np.frombuffer(buf, np.uint8), scan.word_view(buf)
    pieces = (b"[0,", b",7,", b"1234567890123456", b"99999999,", b"100000000")
    spans = [(text.index(x), text.index(x) + len(x)) for x in pieces]
    first, stop = np.array(spans).T
    first[0], first[1], stop[0], stop[1], stop[3] = first[0] + 1, first[1] + 1, stop[0] - 1, stop[1] - 1, stop[3] - 1
    assert scan._numbers(words, a, first, stop).tolist() == [0, 7, 1234567890123456, 99999999, 100000000]
    z = text.index(b"05")
    assert scan._numbers(words, a, np.array([z]), np.array([z + 2])) is None


# ---- bad input, each under both layouts -------------------------------------------------------------
LAYOUTS = {"compact": compact, "spaced": lambda h: json.dumps(h).encode()}


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def write_shard(path, header, data=b"", layout="compact", raw=None):
    """Write a shard from a header dict (or raw header bytes) and data bytes; return its path."""
    h = raw if raw is not None else LAYOUTS[layout](header)
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)
    return path


def good_header(prefix="t"):
    return {"__metadata__": {"format": "pt"},
            f"{prefix}.a": entry("F32", [2, 2], 0, 16), f"{prefix}.b": entry("U8", [3], 16, 19)}


def refused(directory, *, file, tensor=None, match=None):
    with pytest.raises(CheckpointError, match=match) as e:
        ShardIndex.open(directory)
    assert e.value.file == str(Path(file).resolve()) and str(Path(file).name) in str(e.value)
    if tensor is not None:
        assert e.value.tensor == tensor and repr(tensor) in str(e.value)
    return e.value


@pytest.fixture(params=sorted(LAYOUTS))
def layout(request):
    return request.param


def test_good_shard_opens_the_same_under_both_layouts(tmp_path, layout):
    write_shard(tmp_path / "model.safetensors", good_header(), bytes(range(19)), layout)
    n = raw_header(tmp_path / "model.safetensors")[0]
    with ShardIndex.open(tmp_path) as index:
        assert [(m, index[m].dtype, index[m].shape, index[m].offset) for m in index.names()] == [
            ("t.a", "F32", (2, 2), 8 + n), ("t.b", "U8", (3,), 8 + n + 16)]
        assert index.read("t.b").tolist() == [16, 17, 18]


def test_file_shorter_than_eight_bytes_is_refused(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(b"\x01\x02")
    refused(tmp_path, file=tmp_path / "a.safetensors", match="too short")


def test_header_length_zero_is_refused(tmp_path):
    write_shard(tmp_path / "a.safetensors", None, bytes(16), raw=b"")
    refused(tmp_path, file=tmp_path / "a.safetensors", match="header length 0")


def test_header_length_past_end_of_file_is_refused(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(struct.pack("<Q", 1000) + b'{"x": 1}')
    refused(tmp_path, file=tmp_path / "a.safetensors", match="past end of file")


def test_truncated_file_with_data_span_past_end_is_refused(tmp_path, layout):
    write_shard(tmp_path / "a.safetensors", good_header(), bytes(18), layout)   # one byte short
    refused(tmp_path, file=tmp_path / "a.safetensors", tensor="t.b", match="past end of file")


@pytest.mark.parametrize("raw", [b'{"t.a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}', b"\xff\xfe{}",
                                 b'{"t.a": {"dtype": "F32", "shape": [01], "data_offsets": [0, 4]}}', b"[1, 2]"])
def test_header_that_is_not_a_utf8_json_object_is_refused(tmp_path, raw):
    write_shard(tmp_path / "a.safetensors", None, bytes(4), raw=raw)
    refused(tmp_path, file=tmp_path / "a.safetensors", match="UTF-8|JSON")


def test_unknown_dtype_is_refused(tmp_path, layout):
    write_shard(tmp_path / "a.safetensors", {"t.a": entry("F8_E4M3X", [4], 0, 4)}, bytes(4), layout)
    refused(tmp_path, file=tmp_path / "a.safetensors", tensor="t.a", match="unknown dtype 'F8_E4M3X'")


def test_span_size_not_numel_times_itemsize_is_refused(tmp_path, layout):
    write_shard(tmp_path / "a.safetensors", {"t.a": entry("F32", [2, 2], 0, 12)}, bytes(12), layout)
    refused(tmp_path, file=tmp_path / "a.safetensors", tensor="t.a",
            match=r"span of 12 bytes, but F32 \[2, 2\] needs 16")


def test_offsets_running_backwards_are_refused(tmp_path, layout):
    write_shard(tmp_path / "a.safetensors", {"t.a": entry("U8", [0], 4, 0)}, bytes(4), layout)
    refused(tmp_path, file=tmp_path / "a.safetensors", tensor="t.a", match="backwards")


@pytest.mark.parametrize("second", [(8, 24), (0, 16), (12, 28)])  # inside, the same bytes, straddling
def test_overlapping_spans_are_refused_as_the_safetensors_library_refuses_them(tmp_path, layout, second):
    header = {"t.a": entry("F32", [2, 2], 0, 16), "t.b": entry("F32", [4], *second)}
    write_shard(tmp_path / "a.safetensors", header, bytes(32), layout)
    refused(tmp_path, file=tmp_path / "a.safetensors", tensor="t.b", match="overlap those of 't.a'")
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    with pytest.raises(SafetensorError):  # the library agrees the file is broken
        load_file(tmp_path / "a.safetensors")


def test_spans_in_another_order_than_the_header_and_with_gaps_are_fine(tmp_path, layout):
    header = {"t.b": entry("U8", [3], 20, 23), "t.a": entry("F32", [2, 2], 0, 16)}
    write_shard(tmp_path / "a.safetensors", header, bytes(range(23)), layout)
    with ShardIndex.open(tmp_path) as index:
        assert index.read("t.b").tolist() == [20, 21, 22]


@pytest.mark.parametrize("bad", [{"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]},
                                 {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]},
                                 {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]},
                                 {"dtype": "F32", "shape": [1.0], "data_offsets": [0, 4]},
                                 {"dtype": "F32", "shape": [1]}, [1, 2], "F32"])
def test_entry_that_is_not_dtype_shape_offsets_is_refused(tmp_path, layout, bad):
    write_shard(tmp_path / "a.safetensors", {"t.a": bad}, bytes(8), layout)
    refused(tmp_path, file=tmp_path / "a.safetensors", tensor="t.a", match="entry is not")


def test_same_tensor_in_two_shards_is_refused_naming_both(tmp_path, layout):
    write_shard(tmp_path / "a.safetensors", good_header(), bytes(19), layout)
    second = {"u.a": entry("U8", [1], 0, 1), "t.b": entry("U8", [3], 1, 4)}
    write_shard(tmp_path / "b.safetensors", second, bytes(4), layout)
    err = refused(tmp_path, file=tmp_path / "b.safetensors", tensor="t.b", match="two shards")
    assert "a.safetensors" in str(err)


def test_same_tensor_twice_in_one_header_is_refused(tmp_path, layout):
    e = json.dumps(entry("U8", [1], 0, 1), separators=(",", ":") if layout == "compact" else None)
    raw = ('{"t.a":%s,"t.a":%s}' if layout == "compact" else '{"t.a": %s, "t.a": %s}') % (e, e)
    write_shard(tmp_path / "a.safetensors", None, bytes(1), raw=raw.encode())
    refused(tmp_path, file=tmp_path / "a.safetensors", tensor="t.a", match="twice")


@pytest.mark.parametrize("header", [{"t.a": entry("F8_E4M3X", [4], 0, 4)}, {"t.a": entry("F32", [2, 2], 0, 12)},
                                    {"t.a": entry("U8", [0], 4, 0)}, {"t.a": entry("U8", [9], 0, 9)}])
def test_compact_layout_reaches_the_shared_checks_through_the_numpy_path(header):
    raw = compact(header)
    assert scan.parse_compact(bytearray(raw + bytes(64)), len(raw)) is not None


def test_empty_directory_is_refused(tmp_path):
    refused(tmp_path, file=tmp_path, match="no \\*.safetensors shards")


def test_missing_directory_is_refused(tmp_path):
    refused(tmp_path / "nowhere", file=tmp_path / "nowhere", match="does not exist")


# ---- model.safetensors.index.json ------------------------------------------------------------------
INDEX_STYLES = {"indent2": lambda o: json.dumps(o, indent=2), "compact": lambda o: json.dumps(o, separators=(",", ":")),
                "default": json.dumps, "escaped": lambda o: json.dumps(o, indent=1).replace(".", "\\u002e")}


def two_shards(d, layout="compact", prefixes=("t", "u")):
    """Two shards of two tensors each; returns the weight_map that matches them."""
    for i, p in enumerate(prefixes, 1):
        write_shard(d / f"model-0000{i}-of-00002.safetensors", good_header(p), bytes(19), layout)
    return {f"{p}.{x}": f"model-0000{i}-of-00002.safetensors" for i, p in enumerate(prefixes, 1) for x in "ab"}


def write_index(d, weight_map, style="indent2"):
    (d / si.INDEX_JSON).write_text(INDEX_STYLES[style]({"metadata": {"total_size": 38}, "weight_map": weight_map}))


@pytest.fixture(params=sorted(INDEX_STYLES))
def style(request):
    return request.param


def test_index_json_in_any_formatting_is_accepted(tmp_path, style, layout):
    write_index(tmp_path, two_shards(tmp_path, layout), style)
    write_shard(tmp_path / "stray.safetensors", good_header("stray"), bytes(19))   # not listed: not a shard
    with ShardIndex.open(tmp_path) as index:
        assert sorted(index.names()) == ["t.a", "t.b", "u.a", "u.b"]
        assert [f.path.name for f in index.files] == [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]


def test_index_json_without_escapes_takes_the_numpy_path(tmp_path, style):
    write_index(tmp_path, two_shards(tmp_path), style)
    raw = (tmp_path / si.INDEX_JSON).read_bytes() + bytes(8)
    assert (scan.weight_map_compact(raw) is None) == (style == "escaped")


@pytest.mark.parametrize("prefixes, edit", [
    (("t", "u"), lambda t: t.replace('"t.b": "', '"t.b":"')),                                  # one entry spaced apart
    (("t{", "u}"), lambda t: t),                                                                # braces inside names
    (("t", "u"), lambda t: t.replace('"metadata": {', '"metadata": {"weight_map": {"x": "y"}, ')),   # key nested first
    (("t", "u"), lambda t: t.replace('"metadata"', '"weight_map": {"t.a": "x"}, "metadata"')),  # twice: last wins
])
def test_index_json_that_the_numpy_path_declines_still_opens_through_json(tmp_path, prefixes, edit):
    wm = two_shards(tmp_path, prefixes=prefixes)
    (tmp_path / si.INDEX_JSON).write_text(edit(json.dumps({"metadata": {"total_size": 38}, "weight_map": wm})))
    with ShardIndex.open(tmp_path) as index:
        assert sorted(index.names()) == sorted(wm)


@pytest.mark.parametrize("edit", [
    lambda t: t.replace('"t.a"', '"t.\ta"'),                                      # a raw tab inside a name
    lambda t: t.replace('.safetensors"\n  }', '.safetensors",\n  }'),           # trailing comma
    lambda t: t[:-2] + ",}",                                                        # broken after the map
])
def test_index_json_that_is_not_json_is_refused_whichever_path_looks(tmp_path, edit):
    text = json.dumps({"metadata": {"total_size": 38}, "weight_map": two_shards(tmp_path)}, indent=2)
    (tmp_path / si.INDEX_JSON).write_text(edit(text))
    refused(tmp_path, file=tmp_path / si.INDEX_JSON, match="not a JSON object")


def test_index_json_naming_a_missing_shard_is_refused(tmp_path, style):
    wm = two_shards(tmp_path)
    wm["v.a"] = "model-00003-of-00002.safetensors"
    write_index(tmp_path, wm, style)
    refused(tmp_path, file=tmp_path / "model-00003-of-00002.safetensors", match="does not exist")


def test_index_json_assigning_a_tensor_to_the_wrong_shard_is_refused_naming_both(tmp_path, style):
    wm = two_shards(tmp_path)
    wm["u.b"] = "model-00001-of-00002.safetensors"
    write_index(tmp_path, wm, style)
    err = refused(tmp_path, file=tmp_path / si.INDEX_JSON, tensor="u.b", match="assigns it to model-00001")
    assert "header is in model-00002-of-00002.safetensors" in str(err)


def test_index_json_listing_a_tensor_no_header_has_is_refused(tmp_path, style):
    wm = two_shards(tmp_path)
    wm["u.c"] = "model-00002-of-00002.safetensors"
    write_index(tmp_path, wm, style)
    refused(tmp_path, file=tmp_path / si.INDEX_JSON, tensor="u.c", match="no shard header lists it")


def test_header_tensor_missing_from_index_json_is_refused(tmp_path, style):
    wm = two_shards(tmp_path)
    del wm["t.b"]
    write_index(tmp_path, wm, style)
    refused(tmp_path, file=tmp_path / "model-00001-of-00002.safetensors", tensor="t.b", match="missing from")


@pytest.mark.parametrize("text", ["{", "[]", '{"weight_map": {}}', '{"weight_map": {"t.a": 1}}', '{"metadata": {}}'])
def test_unusable_index_json_is_refused(tmp_path, text):
    two_shards(tmp_path)
    (tmp_path / si.INDEX_JSON).write_text(text)
    refused(tmp_path, file=tmp_path / si.INDEX_JSON)


def test_arrays_from_read_outlive_close(tmp_path):
    write_shard(tmp_path / "a.safetensors", good_header(), bytes(range(19)))
    index = ShardIndex.open(tmp_path)
    kept = index.read("t.b")
    index.close()
    assert kept.tolist() == [16, 17, 18]


@pytest.mark.parametrize("name", ["../elsewhere.safetensors", "/etc/passwd", "sub/a.safetensors", "..", "a\\b"])
def test_an_index_naming_anything_but_a_plain_file_name_is_refused(tmp_path, name):
    write_shard(tmp_path / "a.safetensors", good_header(), bytes(range(19)))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"t.a": name, "t.b": name}}))
    with pytest.raises(CheckpointError, match="not a plain file name"):
        ShardIndex.open(tmp_path)


def test_a_symlinked_shard_is_fine_as_hub_caches_make_them(tmp_path):
    (tmp_path / "blobs").mkdir()
    write_shard(tmp_path / "blobs" / "abc123", good_header(), bytes(range(19)))
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "a.safetensors").symlink_to(tmp_path / "blobs" / "abc123")
    (tmp_path / "m" / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"t.a": "a.safetensors", "t.b": "a.safetensors"}}))
    with ShardIndex.open(tmp_path / "m") as index:
        assert index.read("t.b").tolist() == [16, 17, 18]
