"""The knobs `k3 tune` turns, and which of them can matter for one model, budget and machine.

A setting is a plain mapping, knob name -> value (JSON as it is: the profile keeps it). `engine_config` turns one
into the EngineConfig and speculation a trial runs with; knobs that cannot move anything here (the ring of a
trunk held whole, expert reads when every expert is cached, prefill chunks longer than every prompt) are left out,
each with the reason, so the table says what was not tried and why.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..interfaces import KERNEL_FAMILIES
from ..plan.engine_config import EngineConfig
from ..generation.generate import AUTO_K

FAMILY = "kernel_threads."        # a knob per kernel family: kernel_threads.attention, …
STORE_KNOBS = ("read_threads", "read_kib", "prefetch", "prefetch_depth", "read_ahead")  # expert-store options
DRAFTS = ("suffix", "ngram")      # draft sources every model has
MODEL_DRAFTS = ("self", "auto")   # the sources that draft with the model on a draft trunk (its RAM is the budget's)
K_VALUES = ("auto", 2, 4, 8)
READ_KIB = (0, 256, 1024, 4096)   # an expert read whole, or in pieces of this many KiB


@dataclass(frozen=True)
class Knob:
    name: str
    values: tuple                                   # what is tried, the untuned value among them
    what: str                                       # what it moves, for the table
    applies: Callable[[Mapping], bool] = lambda setting: True  # whether it means anything beside the others
    phase: str = "decode"                           # judged by the reply's s/token, "prefill": the prompts' time,
                                                    # "turn": a conversation's turns, prompt and reply (search.PHASES)


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
    has_family_threads: bool    # the kernel backend takes per-family thread counts
    coded_trunk: bool = False   # a coded pack whose placer may hold pinned layers coded (pin_coded)
    trunk_gb: float = 0.0       # the untuned budgets: trunk (0 without a packed trunk), expert cache, prompt cache
    cache_gb: float = 1.0
    prompt_cache_gb: float = 0.0
    draft_gb: Mapping = field(default_factory=dict)  # draft trunk (as --draft-trunk names it) -> GB its weights take
    top_k: int = 1              # the model's routed experts per token
    expert_kib: int = 0         # KiB one expert's read takes
    conversation: bool = False  # the prompts can be one conversation's turns (two or more)

    def cache_gb_for(self, setting: Mapping) -> float:
        """The expert cache's GB under `setting`: the untuned cache's, plus what its trunk, prompt cache and draft
        trunk take less than the untuned ones (their sum is the budget, the same for every setting)."""
        draft = self.draft_gb.get(setting.get("draft_trunk"), 0.0) if setting.get("draft") in MODEL_DRAFTS else 0.0
        return round(self.cache_gb + (self.trunk_gb - setting.get("trunk_gb", self.trunk_gb))
                     + (self.prompt_cache_gb - setting.get("prompt_cache_gb", self.prompt_cache_gb)) - draft, 3)


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
        defaults = {"read_threads": 16, "read_kib": 0, "prefetch": True, "prefetch_depth": 1, "read_ahead": True}
        setting.update({k: options.get(k, v) for k, v in defaults.items() if k in shape.store_options})
    if shape.longest_prompt > min(CHUNKS):
        setting["prefill_chunk"] = base.prefill_chunk
    if shape.draft_gb:  # the draft trunk given first, routed as given (None: half the model's experts)
        setting.update(draft_trunk=next(iter(shape.draft_gb)), draft_topk=base.draft_topk)
    if shape.conversation:
        setting["prompt_cache_gb"] = shape.prompt_cache_gb
    return setting


CHUNKS = (64, 128, 256, 512, 1024, 2048)


def drafts_with_the_model(setting: Mapping) -> bool:
    return setting.get("draft") in MODEL_DRAFTS


def prefetches(setting: Mapping) -> bool:
    return setting.get("prefetch") is True


def draft_topks(first, top_k: int) -> tuple:
    """The draft model's routed experts per token worth trying: `first`, then 1, a quarter, half (None, the default)
    and all of `top_k`, each count once."""
    out: dict = {}
    for v in (first, 1, max(1, top_k // 4), None, top_k):
        out.setdefault(max(1, top_k // 2) if v is None else v, v)
    return tuple(out.values())


def knobs_for(shape: Shape, start: Mapping) -> tuple[list[Knob], list[str]]:
    """The knobs worth turning, most promising first, and a line for each left out."""
    knobs, left = [], []
    drafts = DRAFTS + (MODEL_DRAFTS if shape.draft_gb else ())
    knobs.append(Knob("draft", ("off",) + drafts, "drafted ids verified in one pass (none, or the source)"))
    knobs.append(Knob("speculate", K_VALUES, "drafted ids per pass (auto adapts to the acceptance)",
                      lambda s: s.get("draft") != "off"))
    if len(shape.draft_gb) > 1:
        knobs.append(Knob("draft_trunk", tuple(shape.draft_gb), "the draft trunk self/auto draft on (its GB come out "
                          "of the expert cache's)", drafts_with_the_model))
    if shape.draft_gb:
        knobs.append(Knob("draft_topk", draft_topks(start["draft_topk"], shape.top_k),
                          f"routed experts per token of the draft model (default: half of {shape.top_k})",
                          drafts_with_the_model))
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
        sizes = [v for v in READ_KIB if v < shape.expert_kib]
        for name, values, what, applies in (
                ("read_threads", (16, 4, 8, 32), "expert reads in flight at once", None),
                ("read_kib", tuple(sizes), f"KiB per read of an expert ({shape.expert_kib} KiB; 0: one read)", None),
                ("prefetch", (True, False), "guessed experts read while attention runs", None),
                ("prefetch_depth", (1, 2, 4), "guesses prefetch reads per token, in top-k's", prefetches),
                ("read_ahead", (True, False), "a prefill round's next experts read early", None)):
            if name not in start:
                left.append(f"{name}: the expert store takes no such option")
            elif len(values) < 2:
                left.append(f"{name}: an expert is {shape.expert_kib} KiB, read whole already")
            else:
                knobs.append(Knob(name, (start[name], *[v for v in values if v != start[name]]), what,
                                  applies or (lambda s: True), "prefill" if name == "read_ahead" else "decode"))
    else:
        left.append("read_threads, read_kib, prefetch, prefetch_depth, read_ahead: every expert is cached (none is "
                    "read while generating)")
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
    pool = shape.cache_gb + shape.prompt_cache_gb  # what the prompt cache may take from the expert cache
    shares = [round(pool * f, 3) for f in (0, 1 / 8, 1 / 4, 1 / 2)]
    if not shape.conversation:
        left.append("prompt_cache_gb: one prompt is no conversation (give two --prompt or more)")
    elif max(shares) < 0.001:
        left.append("prompt_cache_gb: the budget leaves the expert cache nothing to give it")
    else:
        first = start["prompt_cache_gb"]
        knobs.append(Knob("prompt_cache_gb", (first, *dict.fromkeys(v for v in shares if v != first)),
                          "RAM for kept prompt states, out of the expert cache's (judged by the turns of one "
                          "conversation sent whole each time, as an API client sends it)", phase="turn"))
    return knobs, left


def engine_config(base: EngineConfig, setting: Mapping, shape: Shape) -> tuple[EngineConfig, dict | None]:
    """The EngineConfig a trial of `setting` opens (with rollback room for the most drafted ids any setting asks,
    so every trial holds the same plan) and its speculation ({"draft", "k"} or None). A draft trunk is opened only
    by a setting that drafts with it; its RAM, the trunk's and the prompt cache's come out of the expert cache's
    (Shape.cache_gb_for), so every setting holds the same budget."""
    fields: dict = {"threads": setting["threads"], "speculate": max(AUTO_K, *[k for k in K_VALUES if k != "auto"])}
    caps = {k[len(FAMILY):]: v for k, v in setting.items() if k.startswith(FAMILY) and v}
    if caps:
        fields["kernel_threads"] = caps
    for name in ("ring", "prefill_chunk", "prompt_cache_gb"):
        if name in setting:
            fields[name] = setting[name]
    cache = shape.cache_gb_for(setting)
    if "trunk_gb" in setting or cache != round(shape.cache_gb, 3):
        fields.update(preset=None, cache_gb=cache)
        if base.trunk is not None:
            fields["trunk_gb"] = setting.get("trunk_gb", shape.trunk_gb)
    options = {k: setting[k] for k in STORE_KNOBS if k in setting}
    if options:
        fields["store_options"] = {**(base.store_options or {}), **options}
    if "pin_coded" in setting:
        fields["placer_options"] = {**(base.placer_options or {}), "pin_coded": setting["pin_coded"]}
    if "draft_trunk" in setting:
        drafting = setting["draft"] in MODEL_DRAFTS
        fields.update(draft_trunk=setting["draft_trunk"] if drafting else None,
                      draft_topk=setting["draft_topk"] if drafting else None)
    spec = None if setting["draft"] == "off" else {"draft": setting["draft"], "k": setting["speculate"]}
    return base.replace(**fields), spec


def saved_engine(base: EngineConfig, setting: Mapping, start: Mapping, shape: Shape) -> dict:
    """The EngineConfig fields the profile keeps for `setting`: those it changes from the untuned `start` (plan/tuned.py
    ENGINE_FIELDS), so a default k3 changes later is not pinned by a tune that kept it. (The draft trunk and its
    routing go with the speculation: run.tuned_result.)"""
    changed = {k for k, v in setting.items() if start.get(k) != v}
    config, _ = engine_config(base, setting, shape)
    out = {"threads": config.threads} if "threads" in changed else {}
    caps = {k[len(FAMILY):]: setting[k] for k in changed if k.startswith(FAMILY) and setting[k]}
    if caps:
        out["kernel_threads"] = caps
    out.update({name: setting[name] for name in ("ring", "prefill_chunk", "prompt_cache_gb") if name in changed})
    if "trunk_gb" in changed or shape.cache_gb_for(setting) != shape.cache_gb_for(start):
        out["cache_gb"] = config.cache_gb
        if config.trunk is not None:
            out["trunk_gb"] = config.budget().trunk_gb
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
    if v is None:
        return "default"
    return f"{v:g}" if isinstance(v, float) else str(v)
