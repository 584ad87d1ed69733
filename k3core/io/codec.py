"""The packed trunk's lossless codec: what `k3 pack --codec planes` stores and how a placer restores it.

A run is cut into BLOCK-byte blocks (the last one shorter). A `planes` block splits every 16-bit word (a
BF16 weight: sign, 8 exponent bits, 7 mantissa bits) into two byte planes (native/planes.h): the sign and
mantissa bits, noise, stored verbatim (the "rest" plane, with an odd block's last byte after it), and the
exponent byte, under 3 bits of information, Huffman-coded near its order-0 entropy (native/exponent_code.h:
a canonical code in four streams, decoded up to four exponents per table lookup). The exponent plane is
cut where a tensor starts (pieces of at least MIN_PIECE words), each piece with its own code:

    rest plane ((n + 1) / 2 bytes) | k: u32 | k × (exponents: u32, piece bytes: u32) | k pieces

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
from ..files.aligned_io import ALIGN, align_up

CODECS = {"raw": "the run's bytes as they are (the default)",
          "planes": "BF16 split into sign+mantissa bytes (verbatim) and exponent bytes (Huffman-coded, "
                    "a code per tensor); 4096-aligned 1 MiB blocks"}
BLOCK = 1 << 20               # restored bytes per block (the default; a pack's manifest says its own):
                              # a multiple of ALIGN, so of every dtype's size
RAW, PLANES = "raw", "planes"
MIN_PIECE = 4096              # exponents per separately coded piece, at least (a code costs ~30 bytes)


@dataclass(frozen=True)
class Block:
    offset: int               # of its stored bytes, from the start of the run's stored bytes (aligned)
    stored: int               # stored bytes (the rest plane, the piece table and pieces; or the raw bytes)
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


# ---- encoding (k3 pack) -------------------------------------------------------------------------------------
def split_planes(raw) -> tuple[np.ndarray, np.ndarray]:
    """(rest plane, exponent plane) of a block's bytes: what native planes_join puts back together."""
    a = np.frombuffer(raw, np.uint8)
    w = a[: a.size // 2 * 2].view("<u2")
    x = (w << 1) | (w >> 15)  # rotl(w, 1): exponent byte high, mantissa << 1 | sign low
    return np.concatenate([(x & 0xFF).astype(np.uint8), a[a.size // 2 * 2:]]), (x >> 8).astype(np.uint8)


def exponent_pieces(words: int, cuts) -> list[tuple[int, int]]:
    """The pieces [a, b) of a block's `words` exponents coded separately: cut at the word offsets
    `cuts` (where tensors start), keeping only cuts that leave MIN_PIECE words on both sides."""
    kept = [0]
    for c in sorted(cuts):
        if c - kept[-1] >= MIN_PIECE and words - c >= MIN_PIECE:
            kept.append(c)
    return list(zip(kept, kept[1:] + [words])) if words else []


def _pieces(exponent: np.ndarray, pieces) -> bytes:
    coded = [_native.exponent_encode(exponent[a:b]) for a, b in pieces]
    table = [v for (a, b), c in zip(pieces, coded) for v in (b - a, len(c))]
    return struct.pack(f"<{1 + len(table)}I", len(pieces), *table) + b"".join(coded)


def encode_block(raw, cuts=()) -> tuple[str, bytes, int]:
    """(kind, stored bytes, checksum) of one block of restored bytes; `cuts`: word offsets where a tensor
    starts in it (a piece per tensor when that codes smaller than one piece)."""
    a = np.frombuffer(raw, np.uint8)
    checksum = _native.planes_checksum(a)
    rest, exponent = split_planes(a)
    coded = _pieces(exponent, [(0, exponent.size)] if exponent.size else [])
    if len(pieces := exponent_pieces(exponent.size, cuts)) > 1:
        coded = min(coded, _pieces(exponent, pieces), key=len)
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
def restore(block: Block, stored, out, what: str) -> None:
    """Block `block`'s stored bytes (`stored`, exactly block.stored of them) → `out` (block.restored bytes);
    a block that does not decode to its checksum is UnsoundRunError naming `what`."""
    src, dst = np.frombuffer(stored, np.uint8, block.stored), np.frombuffer(out, np.uint8, block.restored)
    if block.kind == RAW:
        dst[:] = src
        got = _native.planes_checksum(dst)
    else:
        try:
            got = _native.planes_restore(src, dst)
        except ValueError as exc:
            raise UnsoundRunError(f"{what} does not decode: it has {exc}; the packed trunk is damaged: run "
                                  "`k3 pack --verify` and re-pack") from None
    if got != block.checksum:
        raise UnsoundRunError(f"{what} fails its checksum (restored {got:016x}, stored {block.checksum:016x}); "
                              "the packed trunk is damaged: run `k3 pack --verify` and re-pack")


def blocks_for(lo: int, hi: int, block: int) -> range:
    """Indices of the blocks of `block` restored bytes that hold restored bytes [lo, hi)."""
    return range(lo // block, max(lo // block, math.ceil(hi / block)))


def order0_bits(counts: np.ndarray) -> float:
    """Order-0 entropy in bits per symbol of a histogram."""
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum())
