"""The `k3` command line: argument parsing, human and JSON output, exit codes.

Exit codes: 0 success; 1 runtime failure; 2 bad usage, config, checkpoint or input;
4 finished but the ids are unsound (an expert read failed); 130 interrupted. Errors go to stderr.
Ctrl-C at any moment, even while this module or a command's modules import, is one line and 130 (interrupt.py).
"""
from __future__ import annotations

from . import interrupt

_importing = interrupt.exit_at_once()  # Ctrl-C while the modules below import: one line, exit 130, at once

import argparse
import difflib
import json
import os
import re
import sys

from .. import __version__
from .options import EXIT_CODES
from ..errors import K3Error

interrupt.restore(_importing)  # from here on Ctrl-C is KeyboardInterrupt, which main() turns into 130


def cmd_presets(args) -> int:
    from ..plan.budget import PRESETS, WORKING_BYTES, auto_preset, mem_available

    available = mem_available()
    try:
        auto = auto_preset(available)
    except K3Error:
        auto = None
    rows = [{"name": n, "trunk_gb": t, "cache_gb": c, "auto": n == auto} for n, (t, c) in PRESETS.items()]
    if args.json:
        print(json.dumps({"available_bytes": available, "auto": auto, "presets": rows}, indent=1))
        return 0
    print(f"MemAvailable {available / 1e9:.1f} GB; auto picks {auto or 'nothing (not even laptop fits)'}\n")
    print(f"  {'preset':<12} {'trunk GB':>9} {'cache GB':>9}  needs about")
    for r in rows:
        need = (r["trunk_gb"] + r["cache_gb"]) + WORKING_BYTES / 1e9
        print(f"  {r['name']:<12} {r['trunk_gb']:>9.0f} {r['cache_gb']:>9.0f}  {need:.1f} GB + decode state"
              + ("   <- auto" if r["auto"] else ""))
    print("\nTrunk GB limits a packed trunk (k3 pack; --trunk DIR); without one the whole trunk is resident.")
    return 0


def cmd_make_model(args) -> int:
    from ..testmodel.make import make_model, planned_bytes, shape_config
    from ..report.meters import ProgressMeter

    size = planned_bytes(shape_config(args.shape))
    print(f"{args.dir}: {args.shape} test model, seed {args.seed}, {args.layout} config, {size / 1e6:,.1f} MB")
    meter = None

    def progress(done, total, fname):
        nonlocal meter
        if meter is None:
            meter = ProgressMeter("wrote", total, total, unit="shard")
        meter.start(fname, 1)
        meter.advance(fname, 1)
        meter.finish(fname)

    try:
        make_model(args.dir, args.shape, args.seed, args.layout, if_missing=args.if_missing, force=args.force,
                   progress=None if args.quiet else progress)
    finally:
        if meter is not None:
            meter.close()
    print(f"{args.dir}: ready")
    return 0


class Parser(argparse.ArgumentParser):
    """Every parser of `k3`, its subcommands' (plugins' too: `add_subparsers` makes each subcommand's parser of
    its parent's class) and theirs: no prefix abbreviations (`--max-token` is refused, not taken for
    `--max-tokens`), and an unknown option refused by the (sub)command that got it, with its own usage line and
    the closest of its options (`did you mean --temperature?`), exit 2. The usage line of an error is short;
    --help gives the whole one."""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False  # whatever a plugin asks: an abbreviation would silently mean another flag
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extra = super().parse_known_args(args, namespace)
        unknown = [a for a in extra if _option_like(a, self.prefix_chars)]
        if unknown:  # extra words that are no option go up: `k3 run MODEL --chat "a question"` takes one
            self.error("; ".join(self._unrecognized(a) for a in unknown))
        return namespace, extra

    def _unrecognized(self, arg: str) -> str:
        name = arg.split("=", 1)[0]
        close = difflib.get_close_matches(name, [s for a in self._actions for s in a.option_strings], n=1)
        return f"unrecognized argument {arg}" + (f"; did you mean {close[0]}?" if close else "")

    def _check_value(self, action, value):
        """argparse's check of a choice, but a mistyped subcommand is refused naming the closest one (`k3 chatt`:
        `did you mean `k3 chat`?`) rather than listing them all; with none close, argparse's list stays."""
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError:
            if not isinstance(action, argparse._SubParsersAction):
                raise
            close = difflib.get_close_matches(value, list(action.choices), n=1)
            if not close:
                raise
            raise argparse.ArgumentError(None, f"unknown command {value!r}; did you mean `{self.prog} {close[0]}`?")

    def format_usage(self) -> str:
        formatter = self.formatter_class(prog=self.prog)
        formatter.add_usage(self.usage, [a for a in self._actions if not a.option_strings], [])
        line = formatter.format_help().strip()
        if self.usage is None:
            line = line.replace(f"usage: {self.prog}", f"usage: {self.prog} [options]", 1)
        return f"{line}   (`{self.prog} --help` lists them)\n"


def _command_parser(parser: argparse.ArgumentParser, args) -> argparse.ArgumentParser:
    """The parser of the (sub)command `args` ran: `k3 bench stream`'s for `k3 bench stream …`."""
    while True:
        chosen = [a.choices.get(getattr(args, a.dest, None)) for a in parser._actions
                  if isinstance(a, argparse._SubParsersAction)]
        if not chosen or chosen[0] is None:
            return parser
        parser = chosen[0]


def _option_like(arg: str, prefix_chars: str) -> bool:
    """Whether argparse took `arg` for an option (not a negative number, a lone `-` or words with a space)."""
    return (len(arg) > 1 and arg[0] in prefix_chars and " " not in arg and arg != "--"
            and not re.fullmatch(r"-\d+|-\d*\.\d+", arg))


class _Contested(Parser):
    """A subcommand name two plugins (or a plugin and k3 itself) add: `k3 NAME …` takes any arguments and exits 2
    with the PluginError naming them; every other command works."""

    def __init__(self, prog: str, refusal: Exception):
        super().__init__(prog=prog, add_help=False)
        self.refusal = refusal

    def parse_known_args(self, args=None, namespace=None):
        namespace = namespace if namespace is not None else argparse.Namespace()
        namespace.func = self.refuse
        return namespace, []

    def refuse(self, args) -> int:
        raise self.refusal


def add_plugin_subcommands(sub, pm) -> None:
    """Call each plugin's k3_subcommands (in pluggy's call order), watching the names it adds. A name already taken
    (by k3 or an earlier plugin) is not argparse's `conflicting subparser` on every command: the later plugin gets a
    detached parser, so the rest of its commands are added, and the name becomes a command that refuses with one
    PluginError line naming the plugins that add it."""
    from ..errors import PluginError

    owners = {name: [None] for name in sub.choices}        # None: k3's own command
    add = sub.add_parser
    for impl in reversed(pm.hook.k3_subcommands.get_hookimpls()):
        plugin = impl.plugin_name

        def add_parser(name, **kwargs):
            names = [name, *kwargs.get("aliases", ())]
            taken = [n for n in names if n in owners]
            for n in taken:
                owners[n].append(plugin)
            if taken:
                for key in ("aliases", "help", "deprecated"):   # add_parser's own, not ArgumentParser's
                    kwargs.pop(key, None)
                kwargs.setdefault("prog", f"{sub._prog_prefix} {name}")
                return sub._parser_class(**kwargs)
            for n in names:
                owners[n] = [plugin]
            return add(name, **kwargs)

        sub.add_parser = add_parser          # this plugin's calls go through the check (instance attribute)
        try:
            impl.function(*[{"subparsers": sub}[a] for a in impl.argnames])
        except argparse.ArgumentError as exc:
            raise PluginError(f"the plugin {plugin!r} could not add its subcommands: {exc}") from None
        finally:
            del sub.add_parser
    for name, who in owners.items():
        if len(who) < 2:
            continue
        plugins = [repr(w) for w in who if w is not None]
        listed = plugins[0] if len(plugins) == 1 else ", ".join(plugins[:-1]) + f" and {plugins[-1]}"
        fix = "(`k3 plugins` lists each plugin's commands)"
        if None in who:
            one = len(plugins) == 1
            text = (f"the plugin{'' if one else 's'} {listed} add{'s' if one else ''} the subcommand {name!r}, which is "
                    f"k3's own, so `k3 {name}` runs neither: uninstall the plugin{'' if one else 's'}, or leave "
                    f"{'it' if one else 'them'} out with K3_PLUGINS {fix}")
            short = f"unavailable: the plugin{'' if one else 's'} {listed} add{'s' if one else ''} it too"
        else:
            both = "both" if len(plugins) == 2 else "all"
            text = (f"the plugins {listed} {both} add the subcommand {name!r}, so `k3 {name}` runs neither: "
                    f"uninstall one of them, or load only one with K3_PLUGINS {fix}")
            short = f"unavailable: the plugins {listed} {both} add it"
        sub.choices[name] = _Contested(f"{sub._prog_prefix} {name}", PluginError(text))
        pseudo = [a for a in sub._choices_actions if a.dest == name]
        if pseudo:
            pseudo[0].help = f"{short} (`k3 {name}` says what to do)"
        else:
            sub._choices_actions.append(sub._ChoicesPseudoAction(name, (), f"{short} (`k3 {name}` says what to do)"))


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = Parser(
        prog="k3", formatter_class=fmt,
        description="Run Kimi K3 on one CPU machine, exactly: the same ids at every memory budget.",
        epilog="first time:\n"
               "  k3 doctor /nvme                              # is this machine ready? (CPU, RAM, disk speed)\n"
               "  k3 setup --dest /nvme/Kimi-K3                # download, verify, pack, save a profile (resumable)\n"
               "  k3 setup --source demo --dest demo-model --yes   # or the small built-in demo model\n"
               "then:\n"
               "  k3 chat                                      # talk in the terminal (the saved profile)\n"
               "  k3 ui                                        # ... or in the browser, on 127.0.0.1\n"
               "  k3 tune                                      # time the settings here, keep the fastest (exact)\n"
               "  k3 run --prompt 'Hello' --max-tokens 40      # one generation, streamed, with a run report\n"
               "  k3 run MODEL --ids 1,2,3 --gen 8 --json r.json   # token ids in and out\n"
               "every command has --help with examples.\n\n"
               + EXIT_CODES)
    p.add_argument("--version", action="version", version=f"k3 {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    from .chat import add_parser as add_chat
    from .run import add_parser as add_run
    add_run(sub)
    add_chat(sub)

    mm = sub.add_parser(
        "make-model", formatter_class=fmt, help="write a small checkpoint in the real K3 format",
        description="Write a test checkpoint in the real format: sharded safetensors with an index json,\n"
                    "BF16/F32 trunk, MXFP4 experts, config.json, tiktoken.model and tokenizer_config.json.\n"
                    "The same shape and seed always give the same bytes. The size is printed before writing.\n\n"
                    "shapes: tiny  = MODEL.md §9's 13-layer oracle shape (~1 MB)\n"
                    "        small = a second shape where every count differs (~3 MB)\n"
                    "        medium = 25 layers, 16 of 64 experts: for streaming tests (~52 MB)\n"
                    "        wide  = real K3 widths, 4 layers, 32 experts (~6.6 GB, for benchmarks)",
        epilog="examples:\n  k3 make-model demo-model --shape tiny --seed 0\n"
               "  k3 make-model /data/k3-wide --shape wide --layout flat")
    mm.add_argument("dir", metavar="DIR")
    mm.add_argument("--shape", default="tiny", choices=["tiny", "small", "medium", "wide"])
    mm.add_argument("--seed", type=int, default=0)
    mm.add_argument("--layout", default="nested", choices=["nested", "flat"],
                    help="nested = the released config.json layout (default); flat = all fields at the root")
    mm.add_argument("--if-missing", action="store_true", help="do nothing if DIR already holds this exact model")
    mm.add_argument("--force", action="store_true", help="replace whatever DIR holds")
    mm.add_argument("--quiet", action="store_true")
    mm.set_defaults(func=cmd_make_model)

    pr = sub.add_parser("presets", help="memory presets and which one auto picks here",
                        description="The trunk / expert-cache budgets each preset gives, and which one --preset auto\n"
                                    "picks from this machine's MemAvailable.", formatter_class=fmt)
    pr.add_argument("--json", action="store_true", help="machine-readable output")
    pr.set_defaults(func=cmd_presets)

    from .plugins_command import add_parser as add_plugins
    add_plugins(sub)
    from .bench import add_parser as add_bench
    from .sim_cache import add_parser as add_sim_cache
    from .doctor import add_parser as add_doctor
    from .pack import add_parser as add_pack
    from .tune import add_parser as add_tune
    from ..plugin_manager import get_plugin_manager
    add_pack(sub)
    add_doctor(sub)
    add_tune(sub)
    add_bench(sub)
    add_sim_cache(sub)
    add_plugin_subcommands(sub, get_plugin_manager())  # the wizard's, the UI's, a third party's
    return p


def main(argv=None) -> int:
    """Run one `k3` command and return its exit code; Ctrl-C is 130 with one line. main() with no argv is the `k3`
    process itself (the console script, python -m k3core) and owns its Ctrl-C (interrupt.py): a Ctrl-C Python would
    drop is raised again, and once the exit code is known a late one exits at once instead of breaking into the
    interpreter's exit. main(argv) — tests, programs that embed k3 — leaves the process's handlers as it found them."""
    if argv is None:
        sys.unraisablehook = interrupt.redeliver_dropped
    try:
        return _command(argv)
    except KeyboardInterrupt:  # while parsing or running; main(argv) also while build_parser imports
        print(interrupt.LINE, file=sys.stderr)
        return interrupt.EXIT_CODE
    finally:
        if argv is None:
            interrupt.exit_at_once_until_the_end()


def _command(argv) -> int:
    """Parse argv and run its command; every error becomes its exit code (a Ctrl-C is main's to report)."""
    # the `k3` process exits at once on a Ctrl-C while the commands' modules import: one landing inside numpy's
    # import of its C extension would come out as numpy's ImportError, not as KeyboardInterrupt
    importing = interrupt.exit_at_once() if argv is None else None
    try:
        parser = build_parser()
    except K3Error as exc:  # a broken plugin: say which, no traceback
        print(f"k3: error: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        if importing is not None:
            interrupt.restore(importing)
    args, extra = parser.parse_known_args(argv)
    if extra and getattr(args, "text", "") is None and len(extra) == 1 and not extra[0].startswith("-"):
        args.text = extra[0]  # `k3 run MODEL --chat "a question"`: the prompt after an option
    elif extra:
        _command_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except K3Error as exc:
        print(f"k3: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # the reader went away (`k3 run … | head -1`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as exc:  # a runtime failure: short message; K3_DEBUG=1 for the traceback
        if os.environ.get("K3_DEBUG"):
            raise
        print(f"k3: runtime failure: {type(exc).__name__}: {exc} (set K3_DEBUG=1 for a traceback)", file=sys.stderr)
        return 1
