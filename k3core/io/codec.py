"""The packed trunk's lossless codec: what `k3 pack --codec planes` stores and how a placer restores it.

A run is cut into BLOCK-byte blocks (the last one shorter). A `planes` block splits every 16-bit word (a
BF16 weight: sign, 8 exponent bits, 7 mantissa bits) into two byte planes (native/planes.h): the sign and
mantissa bits, noise, stored verbatim (the "rest" plane, with an odd block's last byte after it), and the
exponent byte, under 3 bits of information, coded by zstd's Huffman literals near its order-0 entropy. The
exponent plane is cut where a tensor starts (pieces of at least MIN_PIECE words), one zstd frame per
piece, so each tensor's exponents get their own code table:

    rest plane ((n + 1) / 2 bytes) | k: u32 | k × (exponents: u32, frame bytes: u32) | k frames

A block whose planes would not be smaller is stored as is (`raw`). Every block starts
at an aligned_io.ALIGN offset, so it is read with O_DIRECT, and carries the checksum of its restored
bytes (native/planes.h), checked on every restore: a corrupt block is UnsoundRunError naming the run
and block, never wrong weights.

Only where bytes are stored changes: the restored bytes are the raw pack's, bit for bit.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

from .. import _native
from ..errors import UnsoundRunError, UsageError
from .aligned_io import ALIGN, align_up

CODECS = {"raw": "the run's bytes as they are (the default)",
          "planes": "BF16 split into sign+mantissa bytes (verbatim) and exponent bytes (zstd Huffman-coded, "
                    "a code table per tensor); 4096-aligned 1 MiB blocks"}
BLOCK = 1 << 20               # restored bytes per block (the default; a pack's manifest says its own):
                              # a multiple of ALIGN, so of every dtype's size
# zstd's fastest strategy with the smallest match tables and 7-byte minimum matches: it finds almost no
# matches in an exponent plane, so a frame is Huffman-coded literals (measured on `wide`'s high-byte plane:
# 2.67 bits per byte and 1.6 GB/s of them decoded per core, against 3.28 bits and 0.6 GB/s at level 3).
ZSTD_PARAMS = dict(strategy="fast", min_match=7, hash_log=6, chain_log=6, search_log=1)
RAW, PLANES = "raw", "planes"
MIN_PIECE = 4096              # exponents per separately coded piece, at least (a code table costs ~100 bytes)


@dataclass(frozen=True)
class Block:
    offset: int               # of its stored bytes, from the start of the run's stored bytes (aligned)
    stored: int               # stored bytes (the rest plane, the piece table and frames; or the raw bytes)
    restored: int
    kind: str                 # RAW or PLANES
    checksum: int             # planes_checksum of the restored bytes

    def entry(self) -> list:
        return [self.offset, self.stored, self.restored, self.kind, f"{self.checksum:016x}"]

    @classmethod
    def of(cls, e, block: int) -> "Block":
        offset, stored, restored, kind, checksum = e
        if kind not in (RAW, PLANES) or not (0 < int(restored) <= block) or int(offset) % ALIGN \
                or not (0 < int(stored) <= int(restored) if kind == PLANES else int(stored) == int(restored)):
            raise ValueError(f"impossible block entry {e!r}")
        return cls(int(offset), int(stored), int(restored), str(kind), int(checksum, 16))


def check_codec(name: str) -> str:
    if name not in CODECS:
        raise UsageError(f"--codec {name!r} is not a trunk codec; the codecs are: "
                         + ", ".join(f"{k} ({v})" for k, v in CODECS.items()))
    return name


def _zstd():
    try:
        import zstandard
    except ImportError:
        raise UsageError("the `planes` trunk codec needs the zstandard package: pip install zstandard") from None
    return zstandard


# ---- encoding (k3 pack) -------------------------------------------------------------------------------------
def _compressor():
    z = _zstd()
    params = {**ZSTD_PARAMS, "strategy": z.STRATEGY_FAST}
    return z.ZstdCompressor(compression_params=z.ZstdCompressionParameters(
        **params, write_content_size=True, write_checksum=False))


def split_planes(raw) -> tuple[np.ndarray, np.ndarray]:
    """(rest plane, exponent plane) of a block's bytes: what native planes_join puts back together."""
    a = np.frombuffer(raw, np.uint8)
    w = a[: a.size // 2 * 2].view("<u2")
    x = (w << 1) | (w >> 15)  # rotl(w, 1): exponent byte high, mantissa << 1 | sign low
    return np.concatenate([(x & 0xFF).astype(np.uint8), a[a.size // 2 * 2:]]), (x >> 8).astype(np.uint8)


def exponent_pieces(words: int, cuts) -> list[tuple[int, int]]:
    """The pieces [a, b) of a block's `words` exponents coded as separate frames: cut at the word offsets
    `cuts` (where tensors start), keeping only cuts that leave MIN_PIECE words on both sides."""
    kept = [0]
    for c in sorted(cuts):
        if c - kept[-1] >= MIN_PIECE and words - c >= MIN_PIECE:
            kept.append(c)
    return list(zip(kept, kept[1:] + [words])) if words else []


def _frames(exponent: np.ndarray, pieces) -> bytes:
    compress = _compressor().compress
    frames = [compress(exponent[a:b].tobytes()) for a, b in pieces]
    table = [v for (a, b), f in zip(pieces, frames) for v in (b - a, len(f))]
    return struct.pack(f"<{1 + len(table)}I", len(pieces), *table) + b"".join(frames)


def encode_block(raw, cuts=()) -> tuple[str, bytes, int]:
    """(kind, stored bytes, checksum) of one block of restored bytes; `cuts`: word offsets where a tensor
    starts in it (a piece per tensor when that codes smaller than one piece)."""
    a = np.frombuffer(raw, np.uint8)
    checksum = _native.planes_checksum(a)
    rest, exponent = split_planes(a)
    coded = _frames(exponent, [(0, exponent.size)])
    if len(pieces := exponent_pieces(exponent.size, cuts)) > 1:
        coded = min(coded, _frames(exponent, pieces), key=len)
    if rest.size + len(coded) >= a.size:
        return RAW, a.tobytes(), checksum
    return PLANES, rest.tobytes() + coded, checksum


def check_block_bytes(block: int) -> int:
    if block <= 0 or block % ALIGN:
        raise UsageError(f"a codec block must be a positive multiple of {ALIGN} bytes, not {block}")
    return block


def encode_run(data, pool=None, block: int = BLOCK, starts=()) -> tuple[list[Block], list[bytes]]:
    """A run's blocks of `block` restored bytes and their stored bytes, each padded to ALIGN (so they can be
    written back to back from an aligned run offset). `starts`: byte offsets in `data` where tensors start
    (even: tensors are 64-byte aligned). `pool`: an executor to encode blocks in parallel."""
    view = memoryview(data).cast("B")
    pieces = [view[i:i + block] for i in range(0, len(view), block)]
    cuts = [[(s - i) // 2 for s in starts if i < s < i + block] for i in range(0, len(view), block)]
    coded = list((pool.map if pool else map)(encode_block, pieces, cuts))
    blocks, stored, at = [], [], 0
    for piece, (kind, payload, checksum) in zip(pieces, coded):
        blocks.append(Block(at, len(payload), len(piece), kind, checksum))
        stored.append(payload + bytes(align_up(len(payload)) - len(payload)))
        at += align_up(len(payload))
    return blocks, stored


def stored_length(blocks: list[Block]) -> int:
    """Bytes the blocks take on disk from the run's first one, padding included."""
    return blocks[-1].offset + align_up(blocks[-1].stored) if blocks else 0


# ---- decoding (placers, k3 pack --verify) ---------------------------------------------------------------------
class Restorer:
    """Decodes stored blocks into restored bytes; one per thread (it keeps a zstd context)."""

    def __init__(self):
        self._dctx = _zstd().ZstdDecompressor()

    def restore(self, block: Block, stored, out, what: str) -> None:
        """Block `block`'s stored bytes (`stored`, exactly block.stored of them) → `out` (block.restored
        bytes); a block that does not decode to its checksum is UnsoundRunError naming `what`."""
        src, dst = np.frombuffer(stored, np.uint8, block.stored), np.frombuffer(out, np.uint8, block.restored)
        if block.kind == RAW:
            dst[:] = src
            got = _native.planes_checksum(dst)
        else:
            rest = (block.restored + 1) // 2
            exponent = self._exponents(block, memoryview(src)[rest:], what)
            got = _native.planes_join(src[:rest], np.frombuffer(exponent, np.uint8), dst)
        if got != block.checksum:
            raise UnsoundRunError(f"{what} fails its checksum (restored {got:016x}, stored {block.checksum:016x}); "
                                  "the packed trunk is damaged: run `k3 pack --verify` and re-pack")

    def _exponents(self, block: Block, coded: memoryview, what: str) -> bytes:
        """The exponent plane of a planes block from its piece table and frames."""
        words, n = block.restored // 2, len(coded)
        k = struct.unpack_from("<I", coded)[0] if n >= 4 else 0
        table = struct.unpack_from(f"<{2 * k}I", coded, 4) if 0 < k <= words and n >= 4 + 8 * k else ()
        counts, sizes = table[0::2], table[1::2]
        if not table or sum(counts) != words or sum(sizes) != n - 4 - 8 * k or not all(counts):
            raise UnsoundRunError(f"{what} has a damaged piece table; the packed trunk is damaged: run "
                                  "`k3 pack --verify` and re-pack")
        pieces, at = [], 4 + 8 * k
        for count, size in zip(counts, sizes):
            try:
                piece = self._dctx.decompress(coded[at:at + size], max_output_size=count)
            except Exception as exc:  # zstandard.ZstdError, and anything a torn frame provokes
                raise UnsoundRunError(f"{what} does not decode ({exc}); the packed trunk is damaged: "
                                      "run `k3 pack --verify` and re-pack") from None
            if len(piece) != count:
                raise UnsoundRunError(f"{what} decodes to {len(piece)} exponents where its table says {count}; "
                                      "the packed trunk is damaged: run `k3 pack --verify` and re-pack")
            pieces.append(piece)
            at += size
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def blocks_for(lo: int, hi: int, block: int) -> range:
    """Indices of the blocks of `block` restored bytes that hold restored bytes [lo, hi)."""
    return range(lo // block, max(lo // block, math.ceil(hi / block)))


def order0_bits(counts: np.ndarray) -> float:
    """Order-0 entropy in bits per symbol of a histogram."""
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum())
