"""The knobs `k3 tune` turns, and which of them can matter for one model, budget and machine.

A setting is a plain mapping, knob name -> value (JSON as it is: the profile keeps it). `engine_config` turns one
into the EngineConfig and speculation a trial runs with; knobs that cannot move anything here (the ring of a
trunk held whole, expert reads when every expert is cached, prefill chunks longer than every prompt) are left out,
each with the reason, so the table says what was not tried and why.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from ..interfaces import KERNEL_FAMILIES
from ..plan.engine_config import EngineConfig
from ..text.generate import AUTO_K

FAMILY = "kernel_threads."        # a knob per kernel family: kernel_threads.attention, …
STORE_KNOBS = ("read_threads", "prefetch", "read_ahead")  # expert-store options
DRAFTS = ("suffix", "ngram")      # draft sources every model has; "self" and "auto" need a draft trunk
K_VALUES = ("auto", 2, 4, 8)


@dataclass(frozen=True)
class Knob:
    name: str
    values: tuple                                   # what is tried, the untuned value among them
    what: str                                       # what it moves, for the table
    applies: Callable[[Mapping], bool] = lambda setting: True  # whether it means anything beside the others
    phase: str = "decode"                           # judged by the reply's s/token, or "prefill": the prompt's time


@dataclass(frozen=True)
class Shape:
    """What decides which knobs can matter."""

    cores: int                  # CPUs this process may use
    layers: int
    trunk_streams: bool         # a packed trunk, not every layer pinned at the untuned budget
    experts_stream: bool        # the expert cache holds fewer than all the model's experts
    store_options: frozenset    # option names the expert store takes
    budget_gb: float | None     # trunk_gb + cache_gb at the untuned settings (None: no packed trunk)
    splits: tuple               # trunk GB values that pin 0, ¼, ½, ¾ or all layers within budget_gb
    longest_prompt: int
    has_draft_trunk: bool
    has_family_threads: bool    # the kernel backend takes per-family thread counts
    coded_trunk: bool = False   # a coded pack whose placer may hold pinned layers coded (pin_coded)


def start_setting(base: EngineConfig, shape: Shape) -> dict:
    """The untuned setting: what a run of `base` would use."""
    options = dict(base.store_options or {})
    setting = {"draft": "off", "speculate": "auto", "threads": base.threads or shape.cores}
    if shape.has_family_threads:
        setting.update({FAMILY + f: 0 for f in KERNEL_FAMILIES[:-1]})  # "other" splits no rows: nothing to cap
    if shape.trunk_streams:
        setting["ring"] = base.ring
    if shape.coded_trunk:
        setting["pin_coded"] = bool((base.placer_options or {}).get("pin_coded", False))
    if shape.budget_gb is not None and len(shape.splits) > 1:
        setting["trunk_gb"] = base.budget().trunk_gb
    if shape.experts_stream:
        defaults = {"read_threads": 16, "prefetch": True, "read_ahead": True}
        setting.update({k: options.get(k, v) for k, v in defaults.items() if k in shape.store_options})
    if shape.longest_prompt > min(CHUNKS):
        setting["prefill_chunk"] = base.prefill_chunk
    return setting


CHUNKS = (64, 128, 256, 512, 1024, 2048)


def knobs_for(shape: Shape, start: Mapping) -> tuple[list[Knob], list[str]]:
    """The knobs worth turning, most promising first, and a line for each left out."""
    knobs, left = [], []
    drafts = DRAFTS + (("self", "auto") if shape.has_draft_trunk else ())
    knobs.append(Knob("draft", ("off",) + drafts, "drafted ids verified in one pass (none, or the source)"))
    knobs.append(Knob("speculate", K_VALUES, "drafted ids per pass (auto adapts to the acceptance)",
                      lambda s: s.get("draft") != "off"))
    threads = sorted({shape.cores, max(1, shape.cores // 2), max(1, shape.cores * 3 // 4), 1}, reverse=True)
    knobs.append(Knob("threads", tuple(threads), "kernel threads"))
    if "trunk_gb" in start:
        knobs.append(Knob("trunk_gb", shape.splits, f"the trunk's share of {shape.budget_gb:g} GB (the rest caches "
                                                     "experts)"))
    elif shape.budget_gb is not None:
        left.append("trunk_gb: the budget has room for one split only")
    if "ring" in start:
        knobs.append(Knob("ring", (2, 3, 4), "slots of the streaming ring (each costs a layer's RAM)"))
    else:
        left.append("ring: no layer streams (the trunk is held whole)")
    if "pin_coded" in start:
        knobs.append(Knob("pin_coded", (False, True), "pinned layers held coded: more fit, each restored per use"))
    if shape.experts_stream:
        for name, values, what in (("read_threads", (16, 4, 8, 32), "expert reads in flight at once"),
                                   ("prefetch", (True, False), "guessed experts read while attention runs"),
                                   ("read_ahead", (True, False), "a prefill round's next experts read early")):
            if name in start:
                knobs.append(Knob(name, values, what, phase="prefill" if name == "read_ahead" else "decode"))
            else:
                left.append(f"{name}: the expert store takes no such option")
    else:
        left.append("read_threads, prefetch, read_ahead: every expert is cached (none is read while generating)")
    if shape.has_family_threads and shape.cores > 1:
        left.append("kernel_threads.other: those kernels (norms, router, elementwise) run on one thread already")
        for family in KERNEL_FAMILIES[:-1]:
            caps = tuple(sorted({0, 1, max(1, shape.cores // 2)}))
            knobs.append(Knob(FAMILY + family, caps, f"threads of the {family} kernels (0: all of --threads)",
                              lambda s: all(v < s["threads"] for k, v in s.items() if k.startswith(FAMILY))))
    if "prefill_chunk" in start:
        first = start["prefill_chunk"]
        chunks = (first, *[c for c in CHUNKS if c < shape.longest_prompt * 2 and c != first])
        knobs.append(Knob("prefill_chunk", chunks, "prompt ids per pass", phase="prefill"))
    else:
        left.append(f"prefill_chunk: the longest prompt ({shape.longest_prompt} ids) fits the shortest chunk "
                    f"tried ({min(CHUNKS)}); tune with a longer --prompt to try it")
    return knobs, left


def engine_config(base: EngineConfig, setting: Mapping, budget_gb: float | None) -> tuple[EngineConfig, dict | None]:
    """The EngineConfig a trial of `setting` opens (with rollback room for the most drafted ids any setting asks,
    so every trial holds the same plan) and its speculation ({"draft", "k"} or None)."""
    fields: dict = {"threads": setting["threads"], "speculate": max(AUTO_K, *[k for k in K_VALUES if k != "auto"])}
    caps = {k[len(FAMILY):]: v for k, v in setting.items() if k.startswith(FAMILY) and v}
    if caps:
        fields["kernel_threads"] = caps
    for name in ("ring", "prefill_chunk"):
        if name in setting:
            fields[name] = setting[name]
    if "trunk_gb" in setting:
        fields.update(preset=None, trunk_gb=setting["trunk_gb"], cache_gb=round(budget_gb - setting["trunk_gb"], 3))
    options = {k: setting[k] for k in STORE_KNOBS if k in setting}
    if options:
        fields["store_options"] = {**(base.store_options or {}), **options}
    if "pin_coded" in setting:
        fields["placer_options"] = {**(base.placer_options or {}), "pin_coded": setting["pin_coded"]}
    spec = None if setting["draft"] == "off" else {"draft": setting["draft"], "k": setting["speculate"]}
    return base.replace(**fields), spec


def saved_engine(base: EngineConfig, setting: Mapping, start: Mapping, budget_gb: float | None) -> dict:
    """The EngineConfig fields the profile keeps for `setting`: those it changes from the untuned `start` (plan/tuned.py
    ENGINE_FIELDS), so a default k3 changes later is not pinned by a tune that kept it."""
    changed = {k for k, v in setting.items() if start.get(k) != v}
    config, _ = engine_config(base, setting, budget_gb)
    out = {"threads": config.threads} if "threads" in changed else {}
    caps = {k[len(FAMILY):]: setting[k] for k in changed if k.startswith(FAMILY) and setting[k]}
    if caps:
        out["kernel_threads"] = caps
    out.update({name: setting[name] for name in ("ring", "prefill_chunk") if name in changed})
    if "trunk_gb" in changed:
        out.update(trunk_gb=config.trunk_gb, cache_gb=config.cache_gb)
    options = {k: setting[k] for k in STORE_KNOBS if k in changed}
    if options:
        out["store_options"] = options
    if "pin_coded" in changed:
        out["placer_options"] = {"pin_coded": setting["pin_coded"]}
    return out


def describe(setting: Mapping, start: Mapping) -> str:
    """What `setting` changes from `start`: "threads=1, ring=3" ("" for the start itself)."""
    return ", ".join(f"{k}={shown(v)}" for k, v in setting.items() if start.get(k) != v)


def shown(v) -> str:
    """A knob's value as the table and the messages write it."""
    if isinstance(v, bool):
        return "on" if v else "off"
    return f"{v:g}" if isinstance(v, float) else str(v)
