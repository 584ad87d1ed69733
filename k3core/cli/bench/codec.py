"""`k3 bench codec`: the lossless trunk codec on a packed trunk's own bytes — stored ÷ raw next to the
order-0 entropy bound of the same bytes, encode speed, and decode (restore) GB/s per core and on every
core, all measured in one run, from memory (no disk in the figures).

The bound: the rest plane verbatim (8 bits per word: sign and mantissa) plus the exponent plane at its
order-0 entropy H, over 16 bits: (8 + H) / 16 of the raw bytes; H is taken per piece (the histogram of
each piece the encoder codes alone: a tensor's part of a block), per block, and over the whole sample.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ...errors import UsageError
from ...plan.budget import cpu_name
from ...machine.rates import restore_rate


def sample_blocks(trunk, sample_bytes: int, block: int) -> list[tuple[bytes, list[int]]]:
    """Blocks of `block` bytes spread evenly over every run of a raw packed trunk, about sample_bytes in all,
    each with the offsets in it where its run's tensors start."""
    from ...files.aligned_io import aligned_buffer
    from ...io.trunk_reader import TrunkReader, room_for

    runs = list(trunk.runs.values())
    total = sum(r.length for r in runs)
    every = max(1, total // sample_bytes) if sample_bytes else 1
    reader, out = TrunkReader(trunk), []
    try:
        buf = aligned_buffer(room_for(trunk, block))
        for run in runs:
            for i, lo in enumerate(range(0, run.length - block + 1, block)):
                if i % every == 0:
                    at = reader.read(run, lo, lo + block, buf)
                    starts = [t.offset - lo for t in run.tensors if lo < t.offset < lo + block]
                    out.append((bytes(memoryview(buf)[at:at + block]), starts))
    finally:
        reader.close()
    return out


def measure(blocks: list[tuple[bytes, list[int]]], block: int, threads: int, seconds: float) -> dict:
    from ...io import codec

    raw = sum(len(b) for b, _ in blocks)
    hist = np.zeros(256, np.int64)
    per_block_bits = per_piece_bits = 0.0
    for b, starts in blocks:
        exponent = codec.split_planes(b)[1]
        h = np.bincount(exponent, minlength=256)
        hist += h
        per_block_bits += codec.order0_bits(h) * h.sum()
        for lo, hi in codec.exponent_pieces(exponent.size, [s // 2 for s in starts]):
            per_piece_bits += codec.order0_bits(np.bincount(exponent[lo:hi], minlength=256)) * (hi - lo)
    words = hist.sum()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        coded = list(pool.map(lambda bs: codec.encode_run(bs[0], block=block, starts=bs[1]), blocks))
    encode_s = time.perf_counter() - t0
    stored = sum(codec.stored_length(bl) for bl, _ in coded)
    payload = sum(b.stored for bl, _ in coded for b in bl)
    pairs = [(bl[0], st[0][:bl[0].stored]) for bl, st in coded]

    one, every = restore_rate(pairs, block, 1, seconds), restore_rate(pairs, block, threads, seconds)
    return {"blocks": len(blocks), "block_bytes": block, "raw_bytes": raw, "stored_bytes": stored,
            "payload_bytes": payload, "ratio": stored / raw, "payload_ratio": payload / raw,
            "bound_per_piece": (8 + per_piece_bits / words) / 16, "bound_per_block": (8 + per_block_bits / words) / 16,
            "bound_whole": (8 + codec.order0_bits(hist)) / 16, "exponent_bits_per_piece": per_piece_bits / words,
            "exponent_bits_per_block": per_block_bits / words, "exponent_bits_whole": codec.order0_bits(hist),
            "planes_blocks": sum(b.kind == codec.PLANES for bl, _ in coded for b in bl),
            "encode_gbps": raw / encode_s / 1e9, "encode_threads": threads,
            "decode_gbps_one_core": one / 1e9, "decode_gbps_all": every / 1e9, "threads": threads}



def cmd_codec(args) -> int:
    from ...io.codec import BLOCK
    from ...io.pack import pack
    from ...io.trunk import load_trunk

    path = Path(args.path)
    if (path / "config.json").exists():  # a checkpoint: its raw pack first, beside the sample
        trunk_dir = Path(args.trunk) if args.trunk else None
        if trunk_dir is None:
            raise UsageError(f"{path} is a checkpoint: give --trunk DIR for its raw pack (made if missing)")
        if not (trunk_dir / "manifest.json").exists():
            print(f"packing {path} into {trunk_dir} first …", file=sys.stderr)
            pack(path, trunk_dir)
        path = trunk_dir
    trunk = load_trunk(path)
    if trunk.codec != "raw":
        raise UsageError(f"{path} is a {trunk.codec} pack; k3 bench codec samples a raw pack (k3 pack without --codec)")
    threads = args.threads or os.cpu_count() or 1
    blocks = sample_blocks(trunk, int(args.sample_gb * 1e9) if not args.all else 0, args.block or BLOCK)
    if not blocks:
        raise UsageError(f"{path} has no run of a whole block ({args.block or BLOCK} bytes): try a smaller --block")
    doc = {"trunk": str(path), "cpu": cpu_name(), **measure(blocks, args.block or BLOCK, threads, args.seconds)}
    print(json.dumps(doc, indent=1) if args.json else codec_table(doc))
    return 0


def codec_table(d: dict) -> str:
    return "\n".join([
        f"codec planes on {d['blocks']} blocks of {d['block_bytes'] >> 10} KiB from {d['trunk']} ({d['cpu']})", "",
        "| measure | value |", "|---|---:|",
        f"| raw bytes sampled | {d['raw_bytes'] / 1e9:.3f} GB |",
        f"| stored ÷ raw (blocks padded to 4096) | {d['ratio']:.4f} |",
        f"| stored ÷ raw (payload only) | {d['payload_ratio']:.4f} |",
        f"| order-0 bound, per piece (a tensor's part of a block) | {d['bound_per_piece']:.4f} "
        f"(exponent {d['exponent_bits_per_piece']:.3f} bits) |",
        f"| order-0 bound, per block | {d['bound_per_block']:.4f} (exponent {d['exponent_bits_per_block']:.3f} bits) |",
        f"| order-0 bound, whole sample | {d['bound_whole']:.4f} (exponent {d['exponent_bits_whole']:.3f} bits) |",
        f"| blocks coded / stored raw | {d['planes_blocks']} / {d['blocks'] - d['planes_blocks']} |",
        f"| encode, {d['encode_threads']} threads | {d['encode_gbps']:.2f} GB/s of raw bytes |",
        f"| decode, 1 core | {d['decode_gbps_one_core']:.2f} GB/s of restored bytes |",
        f"| decode, {d['threads']} threads | {d['decode_gbps_all']:.2f} GB/s of restored bytes |"])


CODEC_HELP = """\
The lossless trunk codec (`k3 pack --codec planes`) on a packed trunk's own bytes, from memory:
  stored ÷ raw        what the coded pack would store, padding to 4096 included, and without it
  order-0 bound       (8 + H) / 16: sign and mantissa verbatim, the exponent byte at its order-0
                      entropy H (per piece the encoder codes alone, per block, whole sample)
  encode              k3 pack's coding rate on every core
  decode              restored GB/s on one core and on every core: a streamed coded trunk is only
                      faster than a raw one where this outruns the disk (which `k3 bench stream` shows)
Blocks are sampled evenly over every run (--sample-gb, or --all).
"""


def add_parser(sub) -> None:
    from ..options import SECONDS, number

    p = sub.add_parser("codec", help="the lossless trunk codec: ratio vs the entropy bound, decode GB/s per core",
                       description=CODEC_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  k3 bench codec /nvme/k3-trunk\n"
                              "  k3 bench codec wizard/data/demo-model --trunk /tmp/demo-trunk --all")
    p.add_argument("path", metavar="TRUNK_DIR|MODEL_DIR", help="a raw packed trunk, or a checkpoint with --trunk")
    p.add_argument("--trunk", metavar="DIR", help="with a checkpoint: its raw pack (made if missing)")
    p.add_argument("--sample-gb", type=number("GB", above=True), default=1.0, metavar="GB", help="bytes sampled (default 1)")
    p.add_argument("--all", action="store_true", help="every whole block of every run")
    p.add_argument("--block", type=int, metavar="BYTES", help="block size (default 1 MiB, what k3 pack uses)")
    p.add_argument("--threads", type=int, metavar="N", help="threads for encode and the all-core decode "
                   "(default: every core)")
    p.add_argument("--seconds", type=SECONDS, default=2.0, metavar="S", help="time per decode figure (default 2)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_codec)
