"""`k3 doctor [PATH]`: is this machine ready to stream Kimi K3, and what to change if not. The checks
themselves live in k3core/machine/checks.py; this is their command line.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

from ..errors import UsageError
from ..machine.checks import Check, check_path, run_checks


def render(checks: list[Check], summary: dict) -> str:
    w = max(len(c.name) for c in checks)
    fix = "\n" + " " * (w + 8) + "fix: "
    lines = [f"{c.status:<4}  {c.name:<{w}}  {c.finding}" + (fix + c.fix if c.status != "ok" else "") for c in checks]
    counts = ", ".join(f"{summary[s]} {s}" for s in ("ok", "warn", "fail"))
    return "\n".join(lines) + f"\n\n{counts} -> exit {summary['exit_code']}"


def cmd_doctor(args) -> int:
    if args.read_mb < 1:
        raise UsageError(f"--read-mb must be at least 1, got {args.read_mb}")
    check_path(args.path)
    if not args.json and sys.stderr.isatty():
        print(f"measuring {args.read_mb} MiB of reads under {args.path} ...", file=sys.stderr)
    checks = run_checks(args.path, args.read_mb)
    counts = {s: sum(c.status == s for c in checks) for s in ("ok", "warn", "fail")}
    summary = {"path": os.path.abspath(args.path), **counts, "exit_code": 1 if counts["fail"] else 0}
    print(json.dumps({"checks": [asdict(c) for c in checks], "summary": summary}, indent=1) if args.json
          else render(checks, summary))
    return summary["exit_code"]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "doctor", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="check this machine for streaming K3: CPU, build, RAM, disk speed, O_DIRECT, threads",
        description="Check whether this machine can stream Kimi K3 and say what to change if not. Each line:\n"
                    "ok|warn|fail, what was checked, what was found; every warn and fail is followed by its fix.\n"
                    "The disk checks write a temporary file of --read-mb MiB under PATH, fsync it, drop it from\n"
                    "the page cache and time reading it back as the engine streams a layer (16 MiB reads one after\n"
                    "another into a huge-page buffer, O_DIRECT where allowed); the file is deleted.",
        epilog="examples:\n"
               "  k3 doctor                       # checks the drive of the current directory\n"
               "  k3 doctor /nvme/k3              # the drive the checkpoint lives on\n"
               "  k3 doctor /nvme/k3 --read-mb 2048 --json > doctor.json\n\n"
               "exit codes (doctor's own):\n"
               "  0  no check failed (warnings allowed)\n"
               "  1  at least one check failed: fix it before `k3 run`\n"
               "  2  bad usage (PATH missing or not writable, --read-mb < 1)")
    p.add_argument("path", nargs="?", default=".", metavar="PATH",
                   help="a writable directory on the drive to test (default: the current directory)")
    p.add_argument("--json", action="store_true", help="print {checks: [...], summary: {...}} as JSON")
    p.add_argument("--read-mb", type=int, default=256, metavar="N",
                   help="MiB to write and read back for the speed test (default 256; more is steadier)")
    p.set_defaults(func=cmd_doctor)
