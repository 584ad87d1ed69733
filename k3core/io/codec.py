"""The packed trunk's lossless codec: what `k3 pack --codec planes` stores and how a placer restores it.

A run is cut into BLOCK-byte blocks (the last one shorter). A `planes` block is its even bytes (the low
byte of every BF16 weight: mantissa noise, stored verbatim) followed by a zstd frame of its odd bytes
(sign + exponent: under 3 bits of information per byte, which zstd's Huffman literals code near the
order-0 entropy). A block whose frame would not be smaller is stored as is (`raw`). Every block starts
at an aligned_io.ALIGN offset, so it is read with O_DIRECT, and carries the checksum of its restored
bytes (native/planes.h), checked on every restore: a corrupt block is UnsoundRunError naming the run
and block, never wrong weights.

Only where bytes are stored changes: the restored bytes are the raw pack's, bit for bit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import _native
from ..errors import UnsoundRunError, UsageError
from .aligned_io import ALIGN, align_up

CODECS = {"raw": "the run's bytes as they are (the default)",
          "planes": "BF16 byte planes: low bytes verbatim, high bytes zstd-coded; 4096-aligned 1 MiB blocks"}
BLOCK = 1 << 20               # restored bytes per block (the default; a pack's manifest says its own):
                              # a multiple of ALIGN, so of every dtype's size
# zstd's fastest strategy with the smallest match tables and 7-byte minimum matches: it finds almost no
# matches in a high-byte plane, so a frame is Huffman-coded literals (measured on `wide`: 2.67 bits per
# high byte and 1.6 GB/s of them decoded per core, against 3.28 bits and 0.6 GB/s at level 3).
ZSTD_PARAMS = dict(strategy="fast", min_match=7, hash_log=6, chain_log=6, search_log=1)
RAW, PLANES = "raw", "planes"


@dataclass(frozen=True)
class Block:
    offset: int               # of its stored bytes, from the start of the run's stored bytes (aligned)
    stored: int               # stored bytes (the low plane + the frame, or the raw bytes)
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


def encode_block(raw) -> tuple[str, bytes, int]:
    """(kind, stored bytes, checksum) of one block of restored bytes."""
    a = np.frombuffer(raw, np.uint8)
    checksum = _native.planes_checksum(a)
    high = np.ascontiguousarray(a[1::2])
    frame = _compressor().compress(high)
    if len(frame) >= high.nbytes:
        return RAW, a.tobytes(), checksum
    return PLANES, a[0::2].tobytes() + frame, checksum


def check_block_bytes(block: int) -> int:
    if block <= 0 or block % ALIGN:
        raise UsageError(f"a codec block must be a positive multiple of {ALIGN} bytes, not {block}")
    return block


def encode_run(data, pool=None, block: int = BLOCK) -> tuple[list[Block], list[bytes]]:
    """A run's blocks of `block` restored bytes and their stored bytes, each padded to ALIGN (so they can be
    written back to back from an aligned run offset). `pool`: an executor to encode blocks in parallel."""
    view = memoryview(data).cast("B")
    pieces = [view[i:i + block] for i in range(0, len(view), block)]
    coded = list(pool.map(encode_block, pieces)) if pool else [encode_block(p) for p in pieces]
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
            low = (block.restored + 1) // 2
            try:
                high = self._dctx.decompress(src[low:], max_output_size=block.restored // 2)
            except Exception as exc:  # zstandard.ZstdError, and anything a torn frame provokes
                raise UnsoundRunError(f"{what} does not decode ({exc}); the packed trunk is damaged: "
                                      "run `k3 pack --verify` and re-pack") from None
            if len(high) != block.restored // 2:
                raise UnsoundRunError(f"{what} decodes to {len(high)} high bytes, not {block.restored // 2}; "
                                      "the packed trunk is damaged: run `k3 pack --verify` and re-pack")
            got = _native.planes_join(src[:low], np.frombuffer(high, np.uint8), dst)
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
