"""What `k3 run` and `k3 chat` share: the engine and budget flags, the sampling flags, opening an
engine (with its memory plan shown first), atomic output files and the exit-code text."""
from __future__ import annotations

import argparse
import sys

from ..errors import UsageError

EXIT_CODES = """exit codes:
  0  success
  1  runtime failure (a bug, or the machine ran out of something)
  2  bad usage, config, checkpoint or input (the message names the field, file or tensor)
  4  the run finished but its ids are unsound (an expert read failed); do not trust them
  130 interrupted (Ctrl-C)"""


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL_DIR", nargs="?",
                   help="checkpoint directory (config.json + safetensors shards); default: the saved profile "
                        "(`k3 setup` writes it)")
    g = p.add_argument_group("compute")
    g.add_argument("--kernels", metavar="NAME",
                   help="kernel backend: avx512, avx2, neon, scalar or reference (default: K3_KERNELS, else the "
                        "best this CPU runs); every backend gives the same bits")
    g.add_argument("--threads", type=int, metavar="N",
                   help="kernel threads (default: the CPUs this process may use); never changes a bit")
    g = p.add_argument_group("memory (see docs/STREAMING.md)")
    g.add_argument("--trunk", metavar="DIR", help="a packed trunk (`k3 pack`): stream what does not fit --trunk-gb "
                   "through a ring of slots instead of holding the whole trunk in RAM")
    g.add_argument("--preset", choices=["laptop", "desktop", "workstation", "server", "max", "auto"],
                   help="trunk and expert-cache budgets in one word (see `k3 presets`); auto from MemAvailable")
    g.add_argument("--trunk-gb", type=float, metavar="GB", help="RAM for the packed trunk: pinned layers + ring")
    g.add_argument("--cache-gb", type=float, metavar="GB", help="RAM for the expert cache (default 1)")
    g.add_argument("--pin-layers", type=int, metavar="N",
                   help="pin exactly the first N layers of the packed trunk instead of as many as --trunk-gb holds")
    g.add_argument("--ring", type=int, default=2, metavar="N",
                   help="slots of the streaming ring (default 2; the next layer is read while one computes)")
    g.add_argument("--max-context", type=int, default=4096, metavar="N",
                   help="positions the memory plan reserves MLA cache for (default 4096)")
    g.add_argument("--expert-store", metavar="NAME", help="expert store plugin: lru (default) or direct, or a "
                   "third party's (see `k3 plugins`)")
    g.add_argument("--trunk-placer", metavar="NAME", help="trunk placer plugin (default: pinned with --trunk, else "
                   "resident)")


def add_sampling_args(p: argparse.ArgumentParser, default_max: int) -> None:
    g = p.add_argument_group("sampling (greedy unless --temperature > 0; filters apply in the order listed)")
    g.add_argument("--repeat-penalty", type=float, default=1.0, metavar="R",
                   help="divide positive / multiply negative logits of ids already in the context by R (1 = off)")
    g.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=0, metavar="K", help="keep the K most likely ids (0 = off)")
    g.add_argument("--top-p", type=float, default=1.0, metavar="P", help="keep the smallest set reaching P (1 = off)")
    g.add_argument("--min-p", type=float, default=0.0, metavar="P",
                   help="drop ids below P × the top probability (0 = off)")
    g.add_argument("--seed", type=int, metavar="N", help="same seed, same text (default: a fresh seed, reported)")
    g.add_argument("--max-tokens", "--gen", dest="max_tokens", type=int, default=default_max, metavar="N",
                   help=f"ids to generate at most (default {default_max})")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop when TEXT appears (repeatable)")
    g.add_argument("--stop-id", action="append", type=int, default=[], metavar="ID", help="stop at this id (repeatable)")


def sampling_params(args):
    from ..text.sampling import SamplingParams

    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          repetition_penalty=args.repeat_penalty, seed=args.seed, max_tokens=args.max_tokens,
                          stop_ids=tuple(args.stop_id), stop_strings=tuple(args.stop))


def budget_options(args) -> dict:
    from ..model.budget import resolve_budget

    if args.ring < 2:
        raise UsageError(f"--ring must be at least 2 slots (a one-slot asynchronous ring overwrites the layer "
                         f"being computed), got {args.ring}")
    budget = resolve_budget(args.preset, args.trunk_gb, args.cache_gb)
    options = {"cache_gb": budget.cache_gb, "ring_slots": args.ring}
    if args.trunk:
        options["trunk_dir"] = args.trunk
        options["trunk_gb"] = budget.trunk_gb
        if args.pin_layers is not None:
            options["pinned_layers"] = args.pin_layers
    elif args.trunk_gb is not None or args.pin_layers is not None:
        raise UsageError("--trunk-gb and --pin-layers apply to a packed trunk: give --trunk DIR (made by `k3 pack`), "
                         "or leave them out to hold the whole trunk in RAM")
    return options


def apply_profile(args) -> None:
    """Without MODEL_DIR, take the model, packed trunk and budgets from the saved profile."""
    from ..io.profile import load_profile, profile_path

    if args.model:
        return
    profile = load_profile()
    if profile is None:
        raise UsageError(f"no MODEL_DIR given and no saved profile at {profile_path()}: run `k3 setup` "
                         "(or `k3 setup --source demo --yes` for the demo model), or give MODEL_DIR")
    args.model = profile.model
    if args.trunk is None:
        args.trunk = profile.trunk
    if args.preset is None and args.trunk_gb is None and args.cache_gb is None:
        args.preset, args.trunk_gb, args.cache_gb = profile.preset, profile.trunk_gb, profile.cache_gb


def open_engine(args):
    from ..model.engine import Engine

    apply_profile(args)
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be at least 1, got {args.threads}")
    return Engine(args.model, kernels=args.kernels, threads=args.threads, expert_store=args.expert_store,
                  trunk_placer=args.trunk_placer, options=budget_options(args), max_context=args.max_context,
                  on_plan=lambda plan: print(plan.text(), file=sys.stderr))
