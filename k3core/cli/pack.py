"""`k3 pack`: the packed trunk from the command line (packing in io/pack.py), and `k3 pack --verify`."""
from __future__ import annotations

import argparse
import sys

from ..errors import TrunkError, UsageError
from ..io.codec import CODECS, RAW
from ..io.pack import pack, size_text, verify
from ..report.meters import PackMeter
from ..io.trunk import load_trunk


def cmd_pack(args) -> int:
    err = sys.stderr
    meter = None if args.quiet else PackMeter(err, "verified" if args.verify else "packed")
    if args.verify:
        if args.paths or (args.deep and not args.model):
            raise UsageError("use: k3 pack --verify TRUNK_DIR [--model MODEL_DIR [--deep]]")
        if problems := verify(args.verify, args.model, deep=args.deep, progress=meter):
            raise TrunkError(f"{args.verify}: {len(problems)} problem(s):\n" + "\n".join(f"  - {p}" for p in problems))
        if not args.quiet:
            trunk = load_trunk(args.verify)
            tied = f"; it belongs to {args.model}, its tensor table matches the checkpoint's headers" if args.model \
                else ("; the manifest is the one k3 pack wrote (its own sha256 matches); give --model MODEL_DIR to "
                      "also prove it belongs to that checkpoint and its tensor table against its headers")
            coded = "" if trunk.codec == RAW else f" ({trunk.codec} codec: every block decodes and checks)"
            print(f"{args.verify}: {len(trunk.runs)} runs, {size_text(trunk.size)}, every sha256 matches{coded}{tied}")
        return 0
    if len(args.paths) != 2 or args.model or args.deep:
        raise UsageError("use: k3 pack MODEL_DIR TRUNK_DIR, or k3 pack --verify TRUNK_DIR [--model MODEL_DIR]")
    say = (lambda msg: None) if args.quiet else (lambda msg: print(f"k3 pack: {msg}", file=err, flush=True))
    try:
        r = pack(args.paths[0], args.paths[1], progress=meter, say=say, codec=args.codec)
    except KeyboardInterrupt:
        print("\nk3 pack: interrupted; finished runs are kept: run the same command to resume", file=err)
        raise
    finally:
        if meter:
            meter.close()
    if not args.quiet and r.status != "up-to-date":
        ratio = "" if args.codec == RAW else \
            f" ({args.codec}: {r.trunk_bytes / max(1, load_trunk(args.paths[1]).manifest['run_bytes']):.4f}× the raw bytes)"
        print(f"{args.paths[1]}: {r.runs} runs, {size_text(r.trunk_bytes)}{ratio}; packed {r.runs_copied} runs, "
              f"{size_text(r.bytes_copied)} in {r.seconds:.1f} s ({r.bytes_copied / max(r.seconds, 1e-9) / 1e9:.2f} GB/s)")
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "pack", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="copy the dense trunk into one aligned file for fast streaming (resumable)",
        usage="%(prog)s MODEL_DIR TRUNK_DIR [--codec raw|planes] [--quiet]\n       %(prog)s --verify TRUNK_DIR [--model MODEL_DIR [--deep]]",
        description=
        "Copy every layer's trunk (all its tensors but the routed experts) and the model-level tensors\n"
        "(embedding, final norms, lm_head) out of the checkpoint into TRUNK_DIR/trunk.bin, one run per layer\n"
        "at a 4096-aligned offset, so the engine reads a whole layer with one O_DIRECT read. On the released\n"
        "K3 that is ~113.5 GB, written once; the engine's pinned/streamed trunk placers read it.\n"
        "TRUNK_DIR/manifest.json records each run's offset, length, sha256 and tensors, and a fingerprint of\n"
        "the checkpoint (shard sizes, header and sampled data hashes, config.json) that ties the pack to it.\n\n"
        "--codec planes stores each run losslessly in 1 MiB blocks: the sign and mantissa bits of every BF16\n"
        "weight as they are, its exponent byte Huffman-coded (a code per tensor), ~0.67x the bytes; the engine\n"
        "restores the exact bytes as it reads (each block checksummed: a damaged one stops the run with\n"
        "exit 4, never wrong weights). It streams faster where the cores restore faster than the disk\n"
        "saves (k3 setup --codec auto decides so); `k3 bench codec TRUNK_DIR` measures the ratio and decode\n"
        "speed on your machine, `k3 bench stream --compare-trunk` the end-to-end difference.\n\n"
        "Resumable: after Ctrl-C, a kill or a power cut, run the same command again; it re-checks the last\n"
        "finished run and continues after it. On a finished pack of the same checkpoint it does nothing.",
        epilog="examples:\n"
               "  k3 pack /models/Kimi-K3 /nvme/k3-trunk            # pack, or resume, or confirm it is done\n"
               "  k3 pack /models/Kimi-K3 /nvme/k3-trunk-z --codec planes   # lossless, ~0.68x the bytes\n"
               "  k3 pack --verify /nvme/k3-trunk                   # re-hash every run and the manifest itself\n"
               "  k3 pack --verify /nvme/k3-trunk --model /models/Kimi-K3          # ...the fingerprint and the tensor table\n"
               "  k3 pack --verify /nvme/k3-trunk --model /models/Kimi-K3 --deep   # ...and the source bytes\n\n"
               "exit codes:\n  0    packed (or already packed); verify found nothing wrong\n"
               "  2    bad checkpoint, TRUNK_DIR not writable (a file, read-only, a symlinked partial file, not\n"
               "       enough free space), or a verify problem (each is named)\n"
               "  130  interrupted: finished runs are kept for the next `k3 pack`")
    p.add_argument("paths", nargs="*", metavar="DIR", help="MODEL_DIR (the checkpoint) and TRUNK_DIR (the pack)")
    p.add_argument("--verify", metavar="TRUNK_DIR", help="check a finished pack instead of packing")
    p.add_argument("--model", metavar="MODEL_DIR", help="with --verify: also check the pack belongs to this checkpoint "
                   "and its manifest's tensor table is the one its headers give")
    p.add_argument("--deep", action="store_true",
                   help="with --verify --model: also re-read each run from the checkpoint and compare hashes")
    p.add_argument("--codec", default=RAW, choices=sorted(CODECS),
                   help="how runs are stored: " + "; ".join(f"{k}: {v}" for k, v in CODECS.items()))
    p.add_argument("--quiet", action="store_true", help="no progress or notes; errors only")
    p.set_defaults(func=cmd_pack)
    return p
