"""The wizard's k3 plugin: adds `k3 setup` and `k3 verify` through the k3_subcommands hook (entry point
`wizard = "wizard.plugin"` in group "k3"), so k3core never imports the wizard. Parsing only; the work is in
wizard/steps.py and wizard/verify.py, imported when a command runs.
"""
from __future__ import annotations

import argparse

from k3core.cli.options import SECONDS, add_logging_arguments, number
from k3core.io.codec import CODECS as TRUNK_CODECS
from k3core.report.logs import configure_logging
from k3core.plugin_api import hookimpl

PRESETS = ["auto", "laptop", "desktop", "workstation", "server", "max"]

DESCRIPTION = """\
Set up Kimi K3 on this machine, step by step; each step says what it will do and how long it should
take, then its result:
  1. machine check     the doctor's checks (CPU and kernels, build, RAM -> preset, disk speed, O_DIRECT)
  2. space             resolve the revision to a commit once; list the files; refuse before the first
                       byte if the checkpoint and the packed trunk do not fit
  3. download          94 weight shards + config and tokenizer files (vision shards with --vision),
                       several at a time, resumable at the byte, with a stall watchdog
  4. verify            every file's size and sha256 against the Hub (and, for moonshotai/Kimi-K3, the
                       published size table); a bad file is fetched again, alone
  5. pack              k3 pack: the dense trunk into one aligned file for streaming
  6. profile           a memory preset from RAM, saved for `k3 run` / `k3 chat`
  7. next              the command to run next

Stop it at any moment (Ctrl-C, kill -9, a power cut) and run the same command again: it continues
where it stopped, from <dest>/.k3-setup.json. A token for gated or private repositories comes from
HF_TOKEN (or your `hf auth login`), else a hidden prompt; it is never printed, logged or stored.
HF_ENDPOINT points it at a mirror or another Hub, as for every huggingface_hub tool."""

EPILOG = """\
sources:
  hf://OWNER/NAME[@REVISION]   a Hub repository (default hf://moonshotai/Kimi-K3, revision main)
  DIR                          a checkpoint already on disk: verified, packed and profiled in place
  demo                         the built-in demo model (generated, a few MB): the `make demo` path

examples:
  k3 setup                                            # asks where, then does everything
  k3 setup --dest /nvme/Kimi-K3 --yes                 # no questions
  k3 setup --dest /nvme/Kimi-K3 --dry-run             # the plan: bytes, disk needed, time
  k3 setup --source hf://moonshotai/Kimi-K3@<sha> --dest /nvme/Kimi-K3 --trunk-dir /fast/k3-trunk --yes
  HF_ENDPOINT=https://my-mirror.example k3 setup --dest /nvme/Kimi-K3 --yes
  k3 setup --source /models/Kimi-K3 --yes             # already downloaded
  k3 setup --source demo --dest demo-model --yes      # the demo model, then `k3 chat`

exit codes:
  0    done (or, with --dry-run, it would fit; offline: by the sizes it could plan with)
  1    a download or runtime failure: finished work is kept, run the same command to resume
  2    bad usage, not enough space (refused before downloading), a token problem, a bad file, the Hub
       unreachable when the setup starts (with --dry-run: only when it has no sizes to plan with)
  130  interrupted: run the same command to resume"""


def cmd_setup(args) -> int:
    from k3core.errors import UsageError

    from .steps import Options, Setup

    if args.jobs < 1 or args.read_mb < 1 or not args.stall > 0:
        raise UsageError("--jobs and --read-mb must be at least 1, --stall more than 0")
    configure_logging(args.log_level)

    opts = Options(source=args.source, dest=args.dest, trunk_dir=args.trunk_dir, preset=args.preset,
                   vision=args.vision, jobs=args.jobs, yes=args.yes, dry_run=args.dry_run, no_pack=args.no_pack,
                   codec=args.codec, read_mb=args.read_mb, stall=args.stall, tune_minutes=args.tune_minutes,
                   no_tune=args.no_tune)
    return Setup(opts).run()


def cmd_verify(args) -> int:
    from .verify import cmd_verify as run
    return run(args)


@hookimpl
def k3_subcommands(subparsers):
    p = subparsers.add_parser("setup", formatter_class=argparse.RawDescriptionHelpFormatter,
                              help="download, verify, pack and profile Kimi K3 (or the demo model), resumably",
                              description=DESCRIPTION, epilog=EPILOG)
    p.add_argument("--source", default="hf://moonshotai/Kimi-K3", metavar="SRC",
                   help="hf://OWNER/NAME[@REVISION], a directory, or demo (default hf://moonshotai/Kimi-K3)")
    p.add_argument("--dest", metavar="DIR", help="where the checkpoint goes (asked if not given; with --yes: "
                   "./NAME of the repository, or ./demo-model)")
    p.add_argument("--trunk-dir", metavar="DIR", help="where the packed trunk goes (default DEST/trunk)")
    p.add_argument("--preset", default="auto", choices=PRESETS,
                   help="memory preset saved in the profile (default auto: the largest that fits in RAM now)")
    p.add_argument("--vision", action="store_true", help="also download the vision shards (not needed for text)")
    p.add_argument("--jobs", type=int, default=4, metavar="N", help="files downloaded / hashed in parallel (4)")
    p.add_argument("--yes", action="store_true", help="ask nothing: take the defaults and the flags given")
    p.add_argument("--dry-run", action="store_true", help="print the plan (files, bytes, disk needed, time from "
                   "measured network and disk rates) and stop; exit 2 if it would not fit. Offline it plans with the "
                   "sizes the last run recorded in --dest, else (moonshotai/Kimi-K3) the published shard sizes k3 "
                   "ships, and says what it could not check; with neither, exit 2")
    p.add_argument("--no-pack", action="store_true", help="skip packing (the whole trunk is then held in RAM)")
    p.add_argument("--codec", default="auto", choices=["auto", *TRUNK_CODECS],
                   help="how the packed trunk stores its bytes: raw, planes (lossless, ~0.67x the bytes, restored on "
                        "the fly), or auto (default): planes where this machine's cores restore faster than its disk "
                        "saves, from the disk speed the machine check measured (k3 pack --help)")
    p.add_argument("--tune-minutes", type=number("minutes", above=True), default=2.0, metavar="M",
                   help="the last step's `k3 tune` stops starting trials after M minutes (default 2)")
    p.add_argument("--no-tune", action="store_true",
                   help="skip the last step's tune (the defaults run; `k3 tune` any time measures the fastest)")
    p.add_argument("--read-mb", type=int, default=64, metavar="N", help="MiB the machine check's disk test reads")
    p.add_argument("--stall", type=SECONDS, default=60.0, metavar="S",
                   help="reconnect a download that received nothing for S seconds (default 60)")
    add_logging_arguments(p)
    p.set_defaults(func=cmd_setup)

    v = subparsers.add_parser(
        "verify", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="re-check every file and tensor of a checkpoint; exit 2 naming each bad one",
        description="Re-read every file of MODEL_DIR and compare it with what `k3 setup` recorded from the Hub\n"
                    "(size and LFS sha256, or the git blob id of small files). A directory k3 setup did not make is\n"
                    "checked against the published shard-size table of the released Kimi K3 and its safetensors\n"
                    "headers. Then the headers are checked against config.json: every tensor the model needs, with its\n"
                    "shape and dtype; --deep reads every weight too. Last, every tensor against the checksum recorded\n"
                    "for it in k3-tensor-sums.bin (what `k3 run` checks each read against).\n\n"
                    "Bad files are named one per line; those k3 setup downloaded are marked, so the next\n"
                    "`k3 setup` fetches only them; elsewhere restore the shards named from where they came from.\n"
                    "Checksums are recorded only where none were (saying that the bytes on disk are trusted, unless\n"
                    "the hashes k3 setup recorded prove them), never over a record the bytes fail: that takes\n"
                    "--record, which trusts the bytes on disk and names each shard whose record it replaces.",
        epilog="examples:\n  k3 verify /nvme/Kimi-K3\n  k3 verify demo-model --jobs 8\n"
               "  k3 verify demo-model --deep          # and every weight\n"
               "  k3 verify my-model --record        # the shards were changed on purpose: trust the bytes on disk\n\n"
               "exit codes:\n  0  every file and tensor matches (checksums recorded where none were)\n"
               "  2  at least one file or tensor is bad or missing (each is named); nothing recorded")
    v.add_argument("model_dir", metavar="MODEL_DIR", help="the checkpoint directory")
    v.add_argument("--jobs", type=int, default=4, metavar="N", help="files hashed in parallel (default 4)")
    v.add_argument("--deep", action="store_true",
                   help="also read every weight: NaN or infinite values are BAD, E8M0 scale bytes of 255 a warning")
    v.add_argument("--record", action="store_true",
                   help="record every tensor's checksum from the bytes on disk, trusting them, even over a record "
                        "they fail (each such shard is named); refused where a recorded hash or the config shows a "
                        "file wrong")
    v.set_defaults(func=cmd_verify)
