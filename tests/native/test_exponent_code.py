"""The exponent planes' entropy code (native/exponent_code.h) against its definition: a reference decoder
that reads the documented format one bit at a time, round trips on adversarial exponent planes, and
damaged pieces that must be refused or decode to other bytes, never crash or read past the piece."""
from __future__ import annotations

import math
import struct

import numpy as np
import pytest

from k3core import _native

rng = np.random.default_rng(14)
MAX_BITS = 11


def reference_decode(piece: bytes, m: int) -> bytes:
    """The format as native/exponent_code.h states it, decoded bit by bit."""
    f, last = piece[0], piece[1]
    nibbles = (last - f + 2) // 2
    lengths = {s: (piece[2 + (s - f) // 2] >> (4 * ((s - f) & 1))) & 15 for s in range(f, last + 1)}
    lengths = {s: n for s, n in lengths.items() if n}
    sizes = list(struct.unpack_from("<3I", piece, 2 + nibbles))
    at = 2 + nibbles + 12
    if f == last:
        assert sizes == [0, 0, 0] and len(piece) == at
        return bytes([f]) * m
    codes, code, prev = {}, 0, None  # canonical: by length, then by exponent
    for s, n in sorted(lengths.items(), key=lambda kv: (kv[1], kv[0])):
        code = 0 if prev is None else (code + 1) << (n - prev)
        codes[(n, code)] = s
        prev = n
    sizes.append(len(piece) - at - sum(sizes))
    q, out = math.ceil(m / 4), bytearray()
    for k in range(4):
        data, bit = piece[at:at + sizes[k]], 0
        at += sizes[k]
        for _ in range(max(0, min(m, (k + 1) * q) - k * q)):
            c = n = 0
            while (n, c) not in codes:
                c, n, bit = c << 1 | (data[bit >> 3] >> (bit & 7)) & 1, n + 1, bit + 1
            out.append(codes[(n, c)])
    return bytes(out)


def gaussian_exponents(n: int, scale: float = 0.02) -> np.ndarray:
    w = (rng.standard_normal(n).astype(np.float32) * scale).view(np.uint32) >> 16
    return ((((w << 1) | (w >> 15)) & 0xFFFF) >> 8).astype(np.uint8)


PLANES = {
    "gaussian": gaussian_exponents(100_000),
    "one exponent": np.full(9000, 121, np.uint8),
    "two exponents": (rng.integers(0, 2, 7001) + 60).astype(np.uint8),
    "every exponent": np.arange(256 * 33).astype(np.uint8),
    "uniform bytes": rng.integers(0, 256, 20_000).astype(np.uint8),
    "long tail (lengths capped at 11)": np.minimum(rng.geometric(0.45, 60_000), 255).astype(np.uint8),
    "exponents 0 and 255 only": np.where(rng.random(5000) < 0.999, 0, 255).astype(np.uint8),
    "subnormals, NaN and Inf": np.concatenate([np.zeros(3000, np.uint8), np.full(40, 255, np.uint8),
                                               gaussian_exponents(3000)]),
}
PLANES.update({f"{m} exponents": gaussian_exponents(m) for m in (1, 2, 3, 4, 5, 7, 19, 20, 21, 79, 80, 81, 333)})


@pytest.mark.parametrize("name", PLANES)
def test_a_piece_decodes_to_its_exponents_natively_and_by_the_definition(name):
    e = PLANES[name]
    piece = _native.exponent_encode(e)
    assert _native.exponent_decode(piece, e.size) == e.tobytes()
    assert reference_decode(piece, e.size) == e.tobytes()
    lengths = [(piece[2 + i // 2] >> (4 * (i & 1))) & 15 for i in range(piece[1] - piece[0] + 1)]
    assert max(lengths) <= MAX_BITS
    if name == "one exponent":
        assert len(piece) == 2 + 1 + 12  # no streams at all
    if name == "gaussian":  # near its order-0 entropy
        p = np.bincount(e) / e.size
        bound = -(p[p > 0] * np.log2(p[p > 0])).sum()
        assert len(piece) * 8 / e.size < bound + 0.08  # Huffman rounds each code to whole bits


def test_the_order0_code_is_near_the_entropy_where_lengths_are_capped():
    e = PLANES["long tail (lengths capped at 11)"]
    p = np.bincount(e) / e.size
    bound = -(p[p > 0] * np.log2(p[p > 0])).sum()
    assert len(_native.exponent_encode(e)) * 8 / e.size < bound + 0.1


def test_damaged_pieces_are_refused_or_decode_to_other_bytes_and_never_read_past_them():
    e = gaussian_exponents(50_000)
    piece = _native.exponent_encode(e)
    refused = 0
    for trial in range(400):
        damaged = bytearray(piece)
        if trial % 4 == 0:
            damaged = damaged[:int(rng.integers(0, len(piece)))]  # torn
        else:
            for _ in range(1 + trial % 3):
                damaged[int(rng.integers(0, min(len(piece), 64 if trial % 2 else len(piece))))] ^= 1 << int(rng.integers(8))
        # a copy in a buffer of exactly its size: reading one byte past it would be outside the object
        try:
            got = _native.exponent_decode(bytes(damaged), e.size)
        except ValueError as exc:
            assert str(exc)  # says what is malformed
            refused += 1
            continue
        assert len(got) == e.size
    assert refused > 50


def test_a_malformed_header_says_what_is_wrong():
    e = gaussian_exponents(4096)
    piece = _native.exponent_encode(e)
    header = piece[:2 + (piece[1] - piece[0] + 2) // 2]  # the range and the code lengths
    cases = {
        "empty": (b"", "shorter than its header"),
        "range": (bytes([9, 3]) + bytes(20), "exponent range is empty"),
        "kraft": (bytes([0, 3, 0x11, 0x11]) + bytes(12), "not a prefix code"),
        "sizes": (header + struct.pack("<3I", 1 << 30, 0, 0), "stream lengths that do not fit"),
        "short stream": (piece[:-200], "ends before its exponents do"),
    }
    for name, (bad, says) in cases.items():
        with pytest.raises(ValueError, match=says):
            _native.exponent_decode(bad, e.size)
