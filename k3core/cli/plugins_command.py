"""`k3 plugins`: every installed plugin with its version, hooks and what each provides; with --check,
the conformance kit (k3core.testing) run on each installed kernel backend, expert store, trunk placer,
draft source and attention backend, pass/fail per check."""
from __future__ import annotations

import argparse
import json

from ..errors import EXIT_CODES, UsageError
from ..plugin_manager import describe_plugins, get_plugin_manager, offered, origin

KINDS = (("k3_kernel_backends", "kernel backend"), ("k3_expert_stores", "expert store"),
         ("k3_trunk_placers", "trunk placer"), ("k3_draft_sources", "draft source"),
         ("k3_attention_backends", "attention backend"))


def targets(pm, name: str | None) -> list[tuple[str, object, str]]:
    """(kind, implementation, where it comes from) for every checkable implementation, or those whose
    name, plugin or distribution is `name`."""
    out = []
    for hook, kind in KINDS:
        for o in offered(pm, hook):
            where = origin(pm, o.plugin)
            if name is None or name in (o.name, o.plugin, where.split(" ")[0]):
                out.append((kind, o.item, where))
    if name is not None and not out:
        known = sorted({o.name for hook, _ in KINDS for o in offered(pm, hook)})
        raise UsageError(f"--check {name!r}: no installed kernel backend, expert store, trunk placer, draft source or "
                         "attention backend has that name, "
                         f"plugin or distribution (installed: {', '.join(known)})")
    return out


def checks_of(kind: str, item) -> list:
    from ..testing import (attention_backend_checks, draft_source_checks, expert_store_checks, kernel_backend_checks,
                           trunk_placer_checks)

    return {"kernel backend": kernel_backend_checks, "expert store": expert_store_checks,
            "trunk placer": trunk_placer_checks, "draft source": draft_source_checks,
            "attention backend": attention_backend_checks}[kind](item)


def cmd_check(args) -> int:
    from ..testing import run_checks

    pm = get_plugin_manager()
    report, failed, passed = [], 0, 0
    for kind, item, where in targets(pm, args.check if args.check != "" else None):
        entry = {"kind": kind, "name": item.name, "from": where, "checks": []}
        report.append(entry)
        if not args.json:
            print(f"{kind} {item.name!r} ({where})", flush=True)
        if kind == "kernel backend" and not item.available():
            entry["skipped"] = "not available on this machine"
            if not args.json:
                print("  SKIP  not available on this machine")
            continue
        for r in run_checks(checks_of(kind, item)):
            what = r.name.split(": ", 1)[1]
            entry["checks"].append({"check": what, "passed": r.passed, "detail": r.detail, "seconds": r.seconds})
            passed += r.passed
            failed += not r.passed
            if not args.json:
                print(f"  {'PASS' if r.passed else 'FAIL'}  {what}  [{r.seconds:.2f} s]"
                      + ("" if r.passed else f"\n        {r.detail}"), flush=True)
    if args.json:
        print(json.dumps({"passed": passed, "failed": failed, "plugins": report}, indent=1))
    else:
        print(f"\n{len(report)} implementation(s) checked: {passed} check(s) passed, {failed} failed")
    return 1 if failed else 0


def cmd_plugins(args) -> int:
    if args.check is not None:
        return cmd_check(args)
    rows = describe_plugins(get_plugin_manager())
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for row in rows:
        print(f"{row['name']} {row['version']} ({row['source']})")
        for hook in row["hooks"]:
            print(f"  {hook}: {', '.join(row['provides'][hook]) or '-'}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser(
        "plugins", help="list installed plugins; --check runs the conformance kit on them",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Every plugin (built-in or from the 'k3' entry-point group) with its version, the hooks it\n"
                    "implements and what each provides.\n\n"
                    "--check runs k3core.testing's conformance checks on every installed kernel backend, expert\n"
                    "store, trunk placer, draft source and attention backend (or only those named): the right bytes\n"
                    "for every request, short reads refused, the scalar backend's bits on the kernel table, ids and\n"
                    "logit bytes identical to the built-ins on generated test models, and an attention state kept\n"
                    "inside a pass (the prompt cache) equal to one forwarded only that far.",
        epilog="examples:\n  k3 plugins\n  k3 plugins --check                # every installed implementation\n"
               "  k3 plugins --check twoq           # one, by its name, plugin or distribution\n"
               "  K3_PLUGINS=none k3 plugins --check   # the built-ins alone\n\n"
               + EXIT_CODES.replace("  4 ", "  1  a conformance check failed (--check)\n  4 "))
    p.add_argument("--check", nargs="?", const="", metavar="NAME",
                   help="run the conformance kit (on NAME only, if given) and print pass/fail per check")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_plugins)
