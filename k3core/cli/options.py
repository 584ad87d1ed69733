"""The flags `k3 run` shares with `k3 chat` and with the subcommands of plugins (`k3 serve`, `k3 ui`, a third
party's): the engine and budget flags and their EngineConfig, the sampling and speculation flags, the logging
flags, and opening an engine with its memory plan and plugin notices shown first. A public module: a
subcommand plugin imports it to take the same flags as `k3 run`. The exit-code text lives in k3core.errors."""
from __future__ import annotations

import argparse
import difflib
import math
import os
import sys
from pathlib import Path

from ..errors import EXIT_CODES, K3Error, UsageError
from ..report.logs import LEVELS

__all__ = ["EXIT_CODES", "GB", "SECONDS", "add_engine_arguments", "add_logging_arguments", "add_prompt_cache_arguments",
           "add_sampling_arguments", "add_speculation_arguments", "engine_config_from_args", "open_engine", "parse_ids",
           "prompt_cache_from_args", "sampling_params_from_args", "speculation_from_args", "number"]


def number(what: str = "a number", low: float = 0.0, *, above: bool = False, high: float | None = None):
    """An argparse type for every float flag of k3 (and of its plugins): a finite number of at least `low` (more than
    `low` with above=True) and at most `high`; nan, inf and anything out of range is refused by argparse, naming the
    flag, exit 2 (`argument --draft-memory: takes GB >= 0, a finite number; got 'nan'`)."""
    bound = f"{what} {'>' if above else '>='} {low:g}" + (f" and <= {high:g}" if high is not None else "")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < low or (above and value == low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"takes {bound}, a finite number; got {text!r}")
        return value

    parse.__name__ = what  # argparse's name for the type in its own messages
    return parse


GB = number("GB")                           # a budget of memory or disk
SECONDS = number("seconds", above=True)     # a length of time


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL_DIR", nargs="?",
                   help="checkpoint directory (config.json + safetensors shards); default: the saved profile "
                        "(`k3 setup` writes it)")
    g = p.add_argument_group("compute")
    g.add_argument("--kernels", metavar="NAME",
                   help="kernel backend: avx512, avx2, neon, scalar (the same bits on each) or reference (numpy, "
                        "slow) (default: K3_KERNELS, else the best this CPU runs)")
    g.add_argument("--threads", type=int, metavar="N",
                   help="kernel threads, at most the CPUs this process may use (the default); never changes a bit")
    g.add_argument("--kernel-threads", action="append", default=[], metavar="FAMILY=N",
                   help="at most N threads for one family of kernels: dense, experts, attention or other (repeatable; "
                        "a family not named uses --threads); never changes a bit")
    g = p.add_argument_group("memory (see docs/STREAMING.md)")
    g.add_argument("--trunk", metavar="DIR", help="a packed trunk (`k3 pack`): stream what does not fit --trunk-gb "
                   "through a ring of slots instead of holding the whole trunk in RAM")
    g.add_argument("--preset", choices=["laptop", "desktop", "workstation", "server", "max", "auto"],
                   help="trunk and expert-cache budgets in one word (see `k3 presets`); auto from MemAvailable")
    g.add_argument("--trunk-gb", type=GB, metavar="GB", help="RAM for the packed trunk: pinned layers + ring")
    g.add_argument("--cache-gb", type=GB, metavar="GB", help="RAM for the expert cache (default 1)")
    g.add_argument("--pin-layers", type=int, metavar="N",
                   help="pin exactly the first N layers of the packed trunk instead of as many as --trunk-gb holds")
    g.add_argument("--ring", type=int, metavar="N",
                   help="slots of the streaming ring (default 2, or what `k3 tune` saved; the next layer is read while "
                        "one computes)")
    g.add_argument("--max-context", type=_context, default="auto", metavar="N|auto",
                   help="positions a conversation may hold, prompt and reply together: a longer prompt is refused, a "
                        "reply stops there; the memory plan reserves decode state for them (default auto: the "
                        "model's own limit, halved until the plan fits this machine's memory, at least 4096)")
    g.add_argument("--prefill-chunk", type=_context, metavar="N|auto",
                   help="prompt ids forwarded per pass: longer chunks read a streamed model's trunk and experts once "
                        "for more ids, and hold more activations. Default auto: the shortest chunk (512 or more) "
                        "projected within 2%% of the fastest per prompt id for what this plan streams, within 1/16 "
                        "of the memory available (the memory plan's row says what it chose and why), or what "
                        "`k3 tune` saved. Never changes a bit")
    g.add_argument("--expert-store", metavar="NAME", help="expert store plugin: lru (default) or direct, or a "
                   "third party's (see `k3 plugins`)")
    g.add_argument("--trunk-placer", metavar="NAME", help="trunk placer plugin (default: pinned with --trunk, else "
                   "resident)")
    g.add_argument("--store-option", action="append", default=[], metavar="NAME=VALUE",
                   help="an option of the expert store, e.g. direct_io=false (repeatable; `k3 plugins` lists stores; "
                        "an unknown NAME is refused with the valid ones)")
    g.add_argument("--placer-option", action="append", default=[], metavar="NAME=VALUE",
                   help="an option of the trunk placer, e.g. pin_head=true (repeatable)")
    g.add_argument("--attention", action="append", default=[], metavar="KIND=NAME",
                   help="attention backend for one kind of layer, e.g. kda=kda (repeatable; default: the first "
                        "installed for each kind)")


def _context(text: str) -> int | str:
    """--max-context, --prefill-chunk: a number (checked by EngineConfig, which names the range) or auto."""
    try:
        return int(text)
    except ValueError:
        return text


def add_sampling_arguments(p: argparse.ArgumentParser, default_max: int) -> None:
    g = p.add_argument_group("sampling (greedy unless --temperature > 0; filters apply in the order listed)")
    g.add_argument("--repeat-penalty", type=number("R", above=True), default=1.0, metavar="R",
                   help="divide positive / multiply negative logits of ids already in the context by R (1 = off)")
    g.add_argument("--temperature", type=number("T"), default=0.0, metavar="T", help="0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=0, metavar="K", help="keep the K most likely ids (0 = off)")
    g.add_argument("--top-p", type=number("P", above=True, high=1), default=1.0, metavar="P", help="keep the smallest set reaching P (1 = off)")
    g.add_argument("--min-p", type=number("P", high=1), default=0.0, metavar="P",
                   help="drop ids below P × the top probability (0 = off)")
    g.add_argument("--seed", type=int, metavar="N", help="same seed, same text (default: a fresh seed, reported)")
    g.add_argument("--max-tokens", "--gen", dest="max_tokens", type=int, default=default_max, metavar="N",
                   help=f"ids to generate at most (default {default_max})")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop when TEXT appears (repeatable)")
    g.add_argument("--stop-id", action="append", type=int, default=[], metavar="ID", help="stop at this id (repeatable)")


def add_speculation_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculative decoding (the same ids in fewer passes over the weights; docs/PERFORMANCE.md)")
    g.add_argument("--speculate", metavar="K|auto",
                   help="each pass forwards the last id plus up to K drafted ids (1-16) and keeps the ones the model "
                        "agrees with; auto adapts K (0-8) to the acceptance, so useless drafts cost almost nothing "
                        "(default: off)")
    g.add_argument("--draft", metavar="NAME", default=None,
                   help="where drafts come from: ngram (default: the longest earlier repeat of the last ids), "
                        "self (the model on its draft trunk: --draft-trunk), auto (each pass suffix or self, whichever "
                        "promises fewer bytes per id), "
                        "suffix (the same over every conversation this process has seen), replay:PATH (ids from a "
                        "file), or an installed draft-source plugin (`k3 plugins`)")
    g.add_argument("--draft-trunk", metavar="DIR|int8|int4", default=None,
                   help="draft with the model itself (--draft self, the default with this flag): run it on this draft "
                        "of --trunk with fewer routed experts; int8 / int4 name TRUNK/draft-int8 / draft-int4, which "
                        "`k3 pack MODEL_DIR TRUNK_DIR --draft int8` derives (docs/DRAFT-TRUNK.md). Held in RAM: the "
                        "memory plan counts it")
    g.add_argument("--draft-topk", type=int, metavar="N", default=None,
                   help="routed experts per token of the draft model (default: half the model's)")
    g.add_argument("--draft-cache-only", action="store_true", default=None,
                   help="the draft model routes only to experts the expert cache holds, so drafting reads nothing "
                        "from disk (its ids agree less often)")
    g.add_argument("--draft-memory", type=GB, metavar="GB", default=None,
                   help="memory a draft source keeps across conversations (suffix's index; default 0.067 GB), "
                        "counted in the memory plan")


DEFAULT_PROMPT_CACHE_GB = 1.0  # RAM for kept prompt states where a command keeps them


def add_prompt_cache_arguments(p: argparse.ArgumentParser) -> None:
    from ..plan.profile import DEFAULT_PROMPT_CACHE_DISK_GB
    from ..generation.prefix_cache import DEFAULT_INTERVAL

    g = p.add_argument_group("prompt cache (a prompt's decode states kept, so any later prompt that starts with the same "
                             "ids forwards only the rest; never changes a bit)")
    g.add_argument("--prompt-cache", metavar="DIR|off", default=None,
                   help="where kept states go on disk, so they outlive this process (default: $K3_CACHE_DIR/"
                        "prompt-cache, else $XDG_CACHE_HOME/k3/prompt-cache, else ~/.cache/k3/prompt-cache); each "
                        "file is checked and tied to this exact model; off: RAM only")
    g.add_argument("--prompt-cache-gb", type=GB, default=None, metavar="GB",
                   help=f"RAM for kept states, least recently used out (default {DEFAULT_PROMPT_CACHE_GB:g}, or what "
                        "`k3 tune` measured; the memory plan counts it)")
    g.add_argument("--prompt-cache-disk-gb", type=GB, default=DEFAULT_PROMPT_CACHE_DISK_GB, metavar="GB",
                   help=f"disk for kept states, least recently used out (default {DEFAULT_PROMPT_CACHE_DISK_GB:g})")
    g.add_argument("--prompt-cache-interval", type=int, default=DEFAULT_INTERVAL, metavar="N",
                   help=f"a long prompt is kept every N ids besides every message boundary (default {DEFAULT_INTERVAL}): "
                        "a prompt that differs inside a message forwards at most N ids it shares")


def prompt_cache_dir(args) -> Path | None:
    """--prompt-cache as a directory (None: off); the default under the user's cache directory."""
    given = getattr(args, "prompt_cache", None)
    if given == "off":
        return None
    if given:
        return Path(given)
    from ..plan.profile import default_prompt_cache_dir

    return default_prompt_cache_dir()


def prompt_cache_from_args(args, engine, tokenizer=None):
    """The PrefixCache the prompt-cache flags ask for on `engine` (None when RAM and disk are both off); message
    boundaries come from the tokenizer's `<|end_of_msg|>`, when it has one."""
    from ..errors import TokenizerError
    from ..text.chat import EOM
    from ..generation.prefix_cache import PrefixCache

    ram, disk_gb, interval = engine.config_in.prompt_cache_gb, args.prompt_cache_disk_gb, args.prompt_cache_interval
    if not (disk_gb >= 0):  # --prompt-cache-gb is EngineConfig's prompt_cache_gb, checked there
        raise UsageError(f"--prompt-cache-disk-gb takes GB >= 0, got {disk_gb}")
    if interval < 1:
        raise UsageError(f"--prompt-cache-interval takes a number of ids >= 1, got {interval}")
    directory = prompt_cache_dir(args)
    if not ram and (directory is None or not disk_gb):
        return None
    try:
        boundaries = [tokenizer.id_of(EOM)] if tokenizer is not None else []
    except TokenizerError:
        boundaries = []
    try:
        return PrefixCache(engine, int(ram * 1e9), interval, boundaries, directory, int(disk_gb * 1e9))
    except OSError as exc:
        raise UsageError(f"--prompt-cache {directory}: cannot use it ({exc.strerror or exc}); give another "
                         "directory, or off") from None


def speculate_k(args) -> int:
    """The --speculate value as drafted ids per pass (auto: its ceiling); 0 when off."""
    from ..plan.engine_config import MAX_SPECULATE
    from ..generation.generate import AUTO_K

    value = getattr(args, "speculate", None)
    if value is None:
        for flag in ("draft", "draft_trunk", "draft_topk", "draft_cache_only"):
            if getattr(args, flag, None) is not None:
                raise UsageError(f"--{flag.replace('_', '-')} needs --speculate K or --speculate auto")
        return 0
    if value == "auto":
        return AUTO_K
    if not (value.isascii() and value.isdigit() and 1 <= int(value) <= MAX_SPECULATE):
        raise UsageError(f"--speculate takes a number of drafted ids 1..{MAX_SPECULATE} or auto, got {value!r}")
    return int(value)


def speculation_from_args(args):
    """The Speculation the flags ask for, or None; the draft source holds to --draft-memory."""
    from ..api import speculation as build

    k = speculate_k(args)
    if not k:
        return None
    spec = build(draft_name(args), "auto" if args.speculate == "auto" else k)
    type(spec.draft).reserve(draft_memory_bytes(args, spec.draft))
    return spec


def draft_name(args) -> str:
    """--draft, else `self` with --draft-trunk, else ngram."""
    return args.draft or ("self" if getattr(args, "draft_trunk", None) else "ngram")


def check_stop_ids(stop_ids, vocab_size: int) -> None:
    """Refuse a --stop-id the model can never produce (it would be silently never met)."""
    for t in stop_ids:
        if not 0 <= t < vocab_size:
            raise UsageError(f"--stop-id {t}: not a token id of this model, whose vocabulary is {vocab_size} ids "
                             f"(0..{vocab_size - 1})")


def draft_memory_bytes(args, draft) -> int:
    """--draft-memory, else what the draft source keeps by default; 0 without speculation."""
    memory = getattr(args, "draft_memory", None)
    if memory is not None and memory < 0:
        raise UsageError(f"--draft-memory takes GB >= 0, got {memory}")
    return int(memory * 1e9) if memory is not None else type(draft).memory_bytes


def draft_memory_gb(args) -> float:
    """What the memory plan counts for the draft source the flags ask for."""
    if not speculate_k(args):
        return 0.0
    spec = speculation_from_args(args)
    return draft_memory_bytes(args, spec.draft) / 1e9


def sampling_params_from_args(args):
    from ..generation.sampling import SamplingParams

    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          repetition_penalty=args.repeat_penalty, seed=args.seed, max_tokens=args.max_tokens,
                          stop_ids=tuple(args.stop_id), stop_strings=tuple(args.stop))


def _attention(pairs) -> dict:
    out = {}
    for pair in pairs:
        kind, sep, name = pair.partition("=")
        if not sep or not kind or not name:
            raise UsageError(f"--attention takes KIND=NAME (e.g. kda=kda), got {pair!r}")
        out[kind] = name
    return out


def _kernel_threads(pairs) -> dict:
    """FAMILY=N pairs of --kernel-threads; N above the CPUs this process may use is refused as --threads is."""
    from ..interfaces import KERNEL_FAMILIES, default_threads

    out = {}
    for pair in pairs:
        family, _, n = pair.partition("=")
        if family not in KERNEL_FAMILIES or not n.isdigit():
            raise UsageError(f"--kernel-threads takes FAMILY=N, FAMILY one of {', '.join(KERNEL_FAMILIES)} "
                             f"(e.g. attention=1), got {pair!r}")
        cpus = default_threads()
        if int(n) > cpus:
            raise UsageError(f"--kernel-threads {pair}: this process may use {cpus} CPU{'s' if cpus > 1 else ''}; "
                             f"give {family}=1..{cpus}")
        out[family] = int(n)
    return out


def _options(pairs, flag: str) -> dict | None:
    """NAME=VALUE pairs; a VALUE that reads as JSON (true, 3, 0.5, null) is that value, else a string."""
    from ..files.limits import loads_limited

    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"{flag} takes NAME=VALUE, got {pair!r}")
        try:
            out[name] = loads_limited(value, f"{flag} {name}")
        except ValueError:
            out[name] = value
    return out or None


def engine_config_from_args(args, tuned: bool = True):
    """The EngineConfig of parsed engine flags; without MODEL_DIR, the saved profile's model, packed
    trunk and budgets (flags given still win). With `tuned`, a run of the profile's model on the machine `k3 tune`
    measured takes its settings for every flag left out (said on stderr unless --quiet), speculation included."""
    from ..api import EngineConfig, config_from_profile

    tuning = profile_tuning(args) if tuned else None
    fields = dict(kernels=args.kernels, threads=args.threads, kernel_threads=_kernel_threads(args.kernel_threads),
                  attention=_attention(args.attention),
                  trunk_placer=args.trunk_placer, expert_store=args.expert_store, trunk=args.trunk,
                  preset=args.preset, trunk_gb=args.trunk_gb, cache_gb=args.cache_gb, ring=args.ring,
                  pin_layers=args.pin_layers, max_context=args.max_context, prefill_chunk=args.prefill_chunk,
                  store_options=_options(args.store_option, "--store-option"),
                  placer_options=_options(args.placer_option, "--placer-option"),
                  tokenizer=getattr(args, "tok", None), speculate=speculate_k(args),
                  sequences=getattr(args, "sequences", 1), kept_states=getattr(args, "keep_states", 0),
                  prompt_cache_gb=getattr(args, "prompt_cache_gb", 0.0),  # None: the tuned or the default
                  draft_memory_gb=draft_memory_gb(args) if hasattr(args, "speculate") else 0.0,
                  draft_trunk=getattr(args, "draft_trunk", None), draft_topk=getattr(args, "draft_topk", None),
                  draft_cache_only=bool(getattr(args, "draft_cache_only", None)))
    check_threads(args.threads)
    if args.model:
        check_model_dir(args.model)
    if tuning is not None:
        fields = tuning.fill(fields)
    if fields["prompt_cache_gb"] is None:
        fields["prompt_cache_gb"] = DEFAULT_PROMPT_CACHE_GB
    fields["prefill_chunk"] = "auto" if fields["prefill_chunk"] is None else fields["prefill_chunk"]
    fields = {k: v for k, v in fields.items() if not (k == "ring" and v is None)}
    try:
        return EngineConfig(args.model, **fields) if args.model else config_from_profile(tuned=False, **fields)
    except UsageError as exc:  # name the flags, not the fields
        text = str(exc)
        for name in fields:
            text = text.replace(f"  - {name} ", f"  - --{FLAGS.get(name, name.replace('_', '-'))} ")
        raise UsageError(text) from None


def profile_tuning(args):
    """The saved profile's tuning when this run is of the profile's model and on the machine it was measured on (its
    line said on stderr unless --quiet); its speculation becomes --speculate / --draft when neither was given."""
    from ..plan.profile import load_profile
    from ..plan.tuned import tuning_for

    try:
        tuning, line = tuning_for(load_profile(), args.model)
    except K3Error:
        if args.model is None:
            raise
        return None  # a damaged profile stops only the runs that need it
    if line and not getattr(args, "quiet", False):
        print(line, file=sys.stderr)
    spec = tuning.speculation if tuning is not None else None
    drafting = ("speculate", "draft", "draft_trunk", "draft_topk", "draft_cache_only")
    if spec and hasattr(args, "speculate") and all(getattr(args, f, None) is None for f in drafting):
        args.speculate, args.draft = str(spec["k"]), spec["draft"]
        if spec.get("draft_trunk"):
            args.draft_trunk = spec["draft_trunk"]
            args.draft_topk = spec.get("draft_topk")
    return tuning


def check_threads(threads) -> None:
    """Refuse --threads above the CPUs this process may use (its affinity): more threads never change a bit,
    only crowd the CPUs, so the number is a mistake."""
    from ..interfaces import default_threads

    cpus = default_threads()
    if threads is not None and threads > cpus:
        raise UsageError(f"--threads {threads}: this process may use {cpus} CPU{'s' if cpus > 1 else ''}; give "
                         f"--threads 1..{cpus}, or leave it out to use {'all ' if cpus > 1 else ''}{cpus}")


def check_model_dir(model) -> None:
    """Refuse a MODEL_DIR that is no checkpoint directory, saying what it is instead: missing (with the close
    names beside it), a file, k3's demo training folder or a source folder (with where the demo model is)."""
    root = Path(model)
    if not root.is_dir():
        raise UsageError(missing_model_dir(model))
    if (root / "config.json").exists():
        return
    if _demo_training_folder(root):
        raise UsageError(f"MODEL_DIR {model}: not a model but k3's demo training folder (its train.py trains the "
                         f"demo model); {demo_model_hint()}")
    if sources := _source_files(root):
        raise UsageError(f"MODEL_DIR {model}: not a model but a source folder ({', '.join(sources)}; no "
                         f"config.json); a model directory holds config.json and safetensors shards. "
                         f"{demo_model_hint()}")


def missing_model_dir(model) -> str:
    """What is wrong with a MODEL_DIR that is no directory; for a missing one, the directory names beside it
    that are close to it (`did you mean demo-model?`)."""
    root = Path(model)
    if root.exists():
        return f"MODEL_DIR {model}: not a directory"
    try:
        with os.scandir(root.parent) as entries:
            names = [e.name for _, e in zip(range(10_000), entries) if e.is_dir()]
    except OSError:
        names = []
    close = [str(root.parent / n) for n in difflib.get_close_matches(root.name, names, n=3)]
    return f"MODEL_DIR {model}: no such directory" + (f"; did you mean {' or '.join(close)}?" if close else "")


def _demo_training_folder(root: Path) -> bool:
    """demo/ of a k3 clone: its train.py writes the demo model's marker."""
    from ..format.notes import DEMO_MARKER

    try:
        with open(root / "train.py", "rb") as f:
            return DEMO_MARKER.encode() in f.read(1 << 20)
    except OSError:
        return False


SOURCE_SUFFIXES = (".py", ".c", ".cc", ".cpp", ".h", ".rs", ".go", ".js", ".ts", ".sh", ".ipynb")
SOURCE_NAMES = ("pyproject.toml", "setup.py", "Makefile", "CMakeLists.txt", "Cargo.toml", "package.json", ".git")


def _source_files(root: Path) -> list[str]:
    """Up to three source files a folder without config.json holds (none if it holds safetensors shards)."""
    try:
        with os.scandir(root) as entries:
            names = sorted(e.name for _, e in zip(range(10_000), entries))
    except OSError:
        return []
    if any(n.endswith(".safetensors") for n in names):
        return []
    found = [n for n in names if n in SOURCE_NAMES or n.endswith(SOURCE_SUFFIXES)]
    return found[:3] + (["…"] if len(found) > 3 else [])


def demo_model_hint() -> str:
    """Where the demo model is: the saved profile's when `k3 setup --source demo` made it, else how to install
    it, and the copy that ships with k3 (format/notes.py's demo_model_dir: a path, as k3core imports no wizard)."""
    from ..format.notes import DEMO_MARKER, demo_model_dir
    from ..plan.profile import load_profile

    try:
        profile = load_profile()
    except K3Error:
        profile = None
    if profile and (profile.source == "demo" or (Path(profile.model) / DEMO_MARKER).is_file()):
        return f"the demo model is {profile.model}, the saved profile's: leave MODEL_DIR out to use it"
    text = "`k3 setup --source demo --yes` installs the demo model and saves it as the profile"
    shipped = demo_model_dir()
    if (shipped / DEMO_MARKER).is_file():
        relative = os.path.relpath(shipped)
        text += f", or give its shipped copy, {shipped if relative.startswith('..') else relative}, as MODEL_DIR"
    return text


FLAGS = {"tokenizer": "tok", "kept_states": "keep-states", "draft_memory_gb": "draft-memory"}  # fields whose flag is not the field's name with dashes


def open_engine(config, show_plan: bool = True):
    """Open `config`'s engine, printing the memory plan (unless not `show_plan`: `k3 run --quiet`) and any plugin
    notice to stderr first, then what the model is when it says (the demo model: not Kimi K3). A plan that does not
    fit is refused with the plan in its error either way."""
    from ..api import open_engine as open_

    from ..format.notes import model_note

    engine = open_(config, on_plan=(lambda plan: print(plan.text(), file=sys.stderr)) if show_plan else None)
    for notice in engine.notices:
        print(notice, file=sys.stderr)
    if note := model_note(config.model):
        print(f"k3: {config.model} is {note}", file=sys.stderr)
    return engine


def parse_ids(text: str, source: str) -> list[int]:
    parts = [p for p in text.replace(",", " ").split() if p]
    bad = next((p for p in parts if not (p.isascii() and p.isdigit() and len(p) <= 18)), None)
    if bad is not None:  # int() would take "١٢" or "+3" or 400 digits: ids are plain decimal numbers
        raise UsageError(f"{source}: {bad[:40]!r} is not a token id (ids are decimal integers 0-9, comma- or "
                         "space-separated)")
    return [int(p) for p in parts]


def add_logging_arguments(parser, access_log: bool = False) -> None:
    g = parser.add_argument_group("logging")
    g.add_argument("--log-level", choices=LEVELS, default="warning",
                   help="what goes to the log on stderr: info adds each step / turn / reload, debug every detail "
                        "(default warning: problems only)")
    if access_log:
        g.add_argument("--access-log", action="store_true",
                       help="also log every HTTP request (method, path, status; never bodies or passwords)")
