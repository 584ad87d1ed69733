"""`k3 pack`: the packed trunk from the command line (packing in io/pack.py), its draft trunk (`--draft`,
io/draft_pack.py), and `k3 pack --verify` of both."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import TrunkError, UsageError
from ..format.checkpoint import open_checkpoint
from ..io.codec import CODECS, RAW
from ..io.draft_pack import derive_draft, verify_draft
from ..io.draft_trunk import KINDS, DraftSpec, default_dir, open_draft_trunk, parse_layers
from ..io.pack import pack, size_text, verify
from ..report.meters import PackMeter
from ..io.trunk import MANIFEST, load_trunk


def _say(args):
    return (lambda msg: None) if args.quiet else (lambda msg: print(f"k3 pack: {msg}", file=sys.stderr, flush=True))


def _verify_drafts(args) -> None:
    """--verify: the draft --draft-dir names, else each TRUNK_DIR/draft-KIND there is; TrunkError listing problems."""
    dirs = [Path(args.draft_dir)] if args.draft_dir else \
        [default_dir(args.verify, kind) for kind in KINDS if (default_dir(args.verify, kind) / MANIFEST).exists()]
    trunk = load_trunk(args.verify)
    for d in dirs:
        meter = None if args.quiet else PackMeter(sys.stderr, "verified")
        try:
            problems = verify_draft(d, trunk, progress=meter)
        finally:
            if meter:
                meter.close()
        if problems:
            raise TrunkError(f"{d}: {len(problems)} problem(s) in the draft trunk:\n" + "\n".join(
                f"  - {p}" for p in problems) + f"\n  remove {d} and run `k3 pack MODEL_DIR {args.verify} --draft "
                "KIND` to derive it again")
        if not args.quiet:
            draft = open_draft_trunk(d, trunk)
            print(f"{d}: {draft.spec.kind} draft of {len(draft.spec.layers)} of {draft.num_layers} layers and the "
                  f"head, {size_text(draft.path.stat().st_size)}, derived from this trunk, every sha256 matches")


def _derive(args, spec: DraftSpec) -> None:
    meter = None if args.quiet else PackMeter(sys.stderr, "derived")
    try:
        r = derive_draft(args.paths[1], spec, args.draft_dir, progress=meter, say=_say(args))
    except KeyboardInterrupt:
        print("\nk3 pack: interrupted; finished draft runs are kept: run the same command to resume", file=sys.stderr)
        raise
    finally:
        if meter:
            meter.close()
    if not args.quiet and r.status != "up-to-date":
        print(f"{r.directory}: {spec.kind} draft of {len(spec.layers)} layers and the head, {size_text(r.draft_bytes)}"
              f"; derived {r.runs_written} runs, {size_text(r.bytes_written)} in {r.seconds:.1f} s")


def cmd_pack(args) -> int:
    err = sys.stderr
    meter = None if args.quiet else PackMeter(err, "verified" if args.verify else "packed")
    if args.verify:
        if args.paths or (args.deep and not args.model) or args.draft or args.draft_layers is not None:
            raise UsageError("use: k3 pack --verify TRUNK_DIR [--model MODEL_DIR [--deep]] [--draft-dir DIR]")
        if problems := verify(args.verify, args.model, deep=args.deep, progress=meter):
            raise TrunkError(f"{args.verify}: {len(problems)} problem(s):\n" + "\n".join(f"  - {p}" for p in problems))
        if not args.quiet:
            trunk = load_trunk(args.verify)
            tied = f"; it belongs to {args.model}, its tensor table matches the checkpoint's headers" if args.model \
                else ("; the manifest is the one k3 pack wrote (its own sha256 matches); give --model MODEL_DIR to "
                      "also prove it belongs to that checkpoint and its tensor table against its headers")
            coded = "" if trunk.codec == RAW else f" ({trunk.codec} codec: every block decodes and checks)"
            print(f"{args.verify}: {len(trunk.runs)} runs, {size_text(trunk.size)}, every sha256 matches{coded}{tied}")
        _verify_drafts(args)
        return 0
    if len(args.paths) != 2 or args.model or args.deep:
        raise UsageError("use: k3 pack MODEL_DIR TRUNK_DIR [--draft int8|int4], or k3 pack --verify TRUNK_DIR "
                         "[--model MODEL_DIR]")
    if (args.draft_layers is not None or args.draft_dir) and not args.draft:
        raise UsageError("--draft-layers and --draft-dir go with --draft int8|int4")
    model, spec = args.paths[0], None
    if args.draft:  # the checkpoint's layer count checks --draft-layers before anything is packed
        model = open_checkpoint(args.paths[0])
        spec = DraftSpec(args.draft, parse_layers(args.draft_layers, model.config.num_hidden_layers))
    try:
        r = pack(model, args.paths[1], progress=meter, say=_say(args), codec=args.codec)
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
    if spec is not None:
        _derive(args, spec)
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "pack", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="copy the dense trunk into one aligned file for fast streaming (resumable)",
        usage="%(prog)s MODEL_DIR TRUNK_DIR [--codec raw|planes] [--draft int8|int4 [--draft-layers SPEC] "
              "[--draft-dir DIR]] [--quiet]\n"
              "       %(prog)s --verify TRUNK_DIR [--model MODEL_DIR [--deep]] [--draft-dir DIR]",
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
        "--draft int8|int4 then derives a draft trunk from the pack, into TRUNK_DIR/draft-int8 (or -int4, or\n"
        "--draft-dir): the weights of a cheaper copy of the model that proposes ids the exact model verifies.\n"
        "Every BF16 matrix of the layers and lm_head is quantized (int8: a scale per row; int4: a scale per 32\n"
        "weights of a row), the rest copied; the embedding stays in the pack. On the released K3 that is\n"
        "~55.6 GB (int8) or ~34.8 GB (int4). --draft-layers 0-11,40 keeps only those layers (a draft skips the\n"
        "others). docs/DRAFT-TRUNK.md has the format.\n\n"
        "Resumable: after Ctrl-C, a kill or a power cut, run the same command again; it re-checks the last\n"
        "finished run and continues after it. On a finished pack of the same checkpoint it does nothing; the\n"
        "same for a finished draft.",
        epilog="examples:\n"
               "  k3 pack /models/Kimi-K3 /nvme/k3-trunk            # pack, or resume, or confirm it is done\n"
               "  k3 pack /models/Kimi-K3 /nvme/k3-trunk-z --codec planes   # lossless, ~0.68x the bytes\n"
               "  k3 pack /models/Kimi-K3 /nvme/k3-trunk --draft int8       # ...and its int8 draft trunk\n"
               "  k3 pack /models/Kimi-K3 /nvme/k3-trunk --draft int4 --draft-layers 0-45   # int4, first 46 layers\n"
               "  k3 pack --verify /nvme/k3-trunk                   # re-hash every run and the manifest itself,\n"
               "                                                    # and of each draft in it\n"
               "  k3 pack --verify /nvme/k3-trunk --model /models/Kimi-K3          # ...the fingerprint and the tensor table\n"
               "  k3 pack --verify /nvme/k3-trunk --model /models/Kimi-K3 --deep   # ...and the source bytes\n\n"
               "exit codes:\n  0    packed (or already packed); verify found nothing wrong\n"
               "  2    bad checkpoint, TRUNK_DIR not writable (a file, read-only, a symlinked partial file, not\n"
               "       enough free space), a bad --draft-layers, a --draft-dir holding another trunk's draft,\n"
               "       or a verify problem (each is named)\n"
               "  130  interrupted: finished runs are kept for the next `k3 pack`")
    p.add_argument("paths", nargs="*", metavar="DIR", help="MODEL_DIR (the checkpoint) and TRUNK_DIR (the pack)")
    p.add_argument("--verify", metavar="TRUNK_DIR", help="check a finished pack instead of packing")
    p.add_argument("--model", metavar="MODEL_DIR", help="with --verify: also check the pack belongs to this checkpoint "
                   "and its manifest's tensor table is the one its headers give")
    p.add_argument("--deep", action="store_true",
                   help="with --verify --model: also re-read each run from the checkpoint and compare hashes")
    p.add_argument("--codec", default=RAW, choices=sorted(CODECS),
                   help="how runs are stored: " + "; ".join(f"{k}: {v}" for k, v in CODECS.items()))
    p.add_argument("--draft", choices=sorted(KINDS), metavar="int8|int4",
                   help="also derive a draft trunk: int8 (a scale per row) or int4 (a scale per 32 weights)")
    p.add_argument("--draft-layers", metavar="SPEC",
                   help="with --draft: the layers the draft keeps, e.g. 0-11,40 (default: every layer)")
    p.add_argument("--draft-dir", metavar="DIR", help="with --draft: where the draft goes (default "
                   "TRUNK_DIR/draft-int8 or draft-int4); with --verify: the draft to verify (default: each one there)")
    p.add_argument("--quiet", action="store_true", help="no progress or notes; errors only")
    p.set_defaults(func=cmd_pack)
    return p
