"""What to run and how: `EngineConfig`, a frozen dataclass every front end fills the same way (the CLI
from its flags, the browser UI from its controls, a program directly), and `resolve`, which opens the
checkpoint's headers and picks the plugins it names (or the defaults) without loading any weight.

Every field problem is reported at once, naming the field; a plugin option the chosen placer or store
does not declare is refused naming it and the valid ones.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Mapping

from .. import plugin_manager as plugins
from ..errors import PluginError, UsageError
from ..interfaces import KERNEL_FAMILIES, Budget, PluginContext, PluginOptions, default_threads
from . import budget as budgets, prefill
from .budget import DEFAULT_CONTEXT, PRESETS, Plan, PlanRow, auto_preset, state_rows
from ..format.checkpoint import Checkpoint, check_binding, open_checkpoint
from ..format.config import context_limit

PRESET_NAMES = (*PRESETS, "auto")
DEFAULT_CACHE_GB = 1.0
MIN_RING = 2
MAX_THREADS = 1024
MIN_CONTEXT, MAX_CONTEXT = 16, 1 << 20        # positions: below 16 nothing useful fits; above, a typo
DEFAULT_PREFILL_CHUNK, MAX_PREFILL_CHUNK = prefill.DEFAULT_CHUNK, 1 << 16
MAX_SPECULATE = 16                            # drafted ids per verify pass
MAX_SEQUENCES = 64                            # sequences per batched pass


@dataclass(frozen=True)
class EngineConfig:
    """An engine to open. Only `model` is required; everything else has the CLI's default."""

    model: str | os.PathLike                      # checkpoint directory: config.json + safetensors shards
    kernels: str | None = None                    # kernel backend name; None: K3_KERNELS, else the best available
    threads: int | None = None                    # kernel threads; None: every CPU this process may use
    # kernel family -> threads (at most `threads`); unnamed families use `threads`
    kernel_threads: Mapping[str, int] = field(default_factory=dict)
    attention: Mapping[str, str] = field(default_factory=dict)  # attention kind -> backend name
    trunk_placer: str | None = None               # None: "pinned" with a packed trunk, else "resident"
    expert_store: str | None = None               # None: the first installed ("lru" unless a plugin comes first)
    trunk: str | os.PathLike | None = None        # packed trunk directory (`k3 pack`)
    preset: str | None = None                     # laptop | desktop | workstation | server | max | auto
    trunk_gb: float | None = None                 # RAM for pinned layers + the ring (needs `trunk`)
    cache_gb: float | None = None                 # RAM for the expert cache (default 1, or the preset's)
    ring: int = MIN_RING                          # slots of the streaming ring
    pin_layers: int | None = None                 # pin exactly this many layers (needs `trunk`)
    max_context: int | str = DEFAULT_CONTEXT      # positions (prompt + reply) a session may hold, or "auto" (auto_context)
    prefill_chunk: int | str = DEFAULT_PREFILL_CHUNK  # prompt ids forwarded per pass, or "auto" (plan/prefill.py)
    speculate: int = 0                            # drafted ids per verify pass the plan reserves rollback for; 0: none
    sequences: int = 1                            # sequences one pass may advance; the plan holds a decode state each
    kept_states: int = 0                          # decode states a server keeps between requests; the plan holds them
    draft_memory_gb: float = 0.0                  # what a draft source keeps across generations (`suffix`'s index)
    prompt_cache_gb: float = 0.0                  # RAM for kept prompt states (a PrefixCache); the plan counts it
    placer_options: Mapping | PluginOptions | None = None  # the trunk placer's own options
    store_options: Mapping | PluginOptions | None = None   # the expert store's own options
    tokenizer: str | os.PathLike | None = None    # tokenizer directory; None: the model directory
    draft_trunk: str | os.PathLike | None = None  # a draft of `trunk` (`k3 pack --draft`); int8/int4: TRUNK/draft-KIND
    draft_topk: int | None = None                 # the draft model's routed experts per token; None: half the model's
    draft_cache_only: bool = False                # the draft model routes only to experts the store holds (reads none)

    def __post_init__(self):
        problems = []

        def check(ok: bool, name: str, want: str):
            if not ok:
                problems.append(f"{name} must be {want}, got {getattr(self, name)!r}")

        check(isinstance(self.model, (str, os.PathLike)) and str(self.model) != "", "model", "a directory path")
        for name in ("kernels", "trunk_placer", "expert_store"):
            value = getattr(self, name)
            check(value is None or (isinstance(value, str) and value), name, "a plugin name or None")
        check(self.threads is None or (_is_int(self.threads) and 1 <= self.threads <= MAX_THREADS), "threads",
              f"an integer in 1..{MAX_THREADS}")
        check(isinstance(self.attention, Mapping) and all(isinstance(k, str) and isinstance(v, str)
                                                          for k, v in self.attention.items()),
              "attention", "a mapping of attention kind to backend name")
        check(isinstance(self.kernel_threads, Mapping) and all(family in KERNEL_FAMILIES and _is_int(n) and
                                                               1 <= n <= MAX_THREADS
                                                               for family, n in self.kernel_threads.items()),
              "kernel_threads", f"a mapping of kernel family ({', '.join(KERNEL_FAMILIES)}) to an integer in "
                                f"1..{MAX_THREADS}")
        check(self.preset is None or self.preset in PRESET_NAMES, "preset", f"one of {', '.join(PRESET_NAMES)}")
        for name in ("trunk_gb", "cache_gb"):
            value = getattr(self, name)
            check(value is None or (_is_num(value) and value >= 0), name, "a finite number of GB >= 0, or None")
        check(_is_int(self.ring) and self.ring >= MIN_RING, "ring",
              f"an integer >= {MIN_RING} (a one-slot asynchronous ring overwrites the layer being computed)")
        check(self.pin_layers is None or (_is_int(self.pin_layers) and self.pin_layers >= 0), "pin_layers",
              "an integer >= 0, or None")
        check(self.max_context == "auto" or _is_int(self.max_context) and MIN_CONTEXT <= self.max_context <= MAX_CONTEXT,
              "max_context", f"an integer in {MIN_CONTEXT}..{MAX_CONTEXT}, or \"auto\"")
        check(self.prefill_chunk == "auto" or _is_int(self.prefill_chunk) and 1 <= self.prefill_chunk <= MAX_PREFILL_CHUNK,
              "prefill_chunk", f"an integer in 1..{MAX_PREFILL_CHUNK}, or \"auto\"")
        check(_is_int(self.speculate) and 0 <= self.speculate <= MAX_SPECULATE, "speculate",
              f"an integer in 0..{MAX_SPECULATE} (0: no speculative decoding)")
        check(_is_int(self.sequences) and 1 <= self.sequences <= MAX_SEQUENCES, "sequences",
              f"an integer in 1..{MAX_SEQUENCES}")
        check(_is_int(self.kept_states) and 0 <= self.kept_states <= MAX_SEQUENCES, "kept_states",
              f"an integer in 0..{MAX_SEQUENCES}")
        check(_is_num(self.draft_memory_gb) and 0 <= self.draft_memory_gb <= 1024, "draft_memory_gb",
              "a number of GB in 0..1024")
        check(_is_num(self.prompt_cache_gb) and 0 <= self.prompt_cache_gb <= 1024, "prompt_cache_gb",
              "a number of GB in 0..1024")
        for name in ("placer_options", "store_options"):
            value = getattr(self, name)
            check(value is None or isinstance(value, (Mapping, PluginOptions)), name,
                  "a mapping of option name to value, a PluginOptions instance, or None")
        if self.trunk is None and (self.trunk_gb is not None or self.pin_layers is not None):
            problems.append("trunk_gb and pin_layers apply to a packed trunk: give trunk (made by `k3 pack`), or leave "
                            "them out to hold the whole trunk in RAM")
        check(self.draft_trunk is None or isinstance(self.draft_trunk, (str, os.PathLike)) and str(self.draft_trunk),
              "draft_trunk", "a draft trunk directory, int8 or int4, or None")
        check(self.draft_topk is None or _is_int(self.draft_topk) and self.draft_topk >= 1, "draft_topk",
              "an integer >= 1 (routed experts per token of the draft model), or None")
        if self.draft_trunk is not None and self.trunk is None:
            problems.append("draft_trunk is derived from a packed trunk and read beside it: give trunk too (the one "
                            "`k3 pack --draft` derived it from)")
        check(isinstance(self.draft_cache_only, bool), "draft_cache_only", "True or False")
        if (self.draft_topk is not None or self.draft_cache_only is True) and self.draft_trunk is None:
            problems.append("draft_topk and draft_cache_only set how the draft model routes: give draft_trunk too")
        if problems:
            raise UsageError("bad engine config:\n" + "\n".join(f"  - {p}" for p in problems))
        object.__setattr__(self, "attention", MappingProxyType(dict(self.attention)))
        object.__setattr__(self, "kernel_threads", MappingProxyType(dict(self.kernel_threads)))
        for name in ("placer_options", "store_options"):
            value = getattr(self, name)
            if isinstance(value, Mapping):
                object.__setattr__(self, name, MappingProxyType(dict(value)))

    def replace(self, **changes) -> "EngineConfig":
        """A copy with some fields changed (checked again)."""
        return replace(self, **changes)

    def budget(self, available: int | None = None) -> Budget:
        """The budgets in force: an explicit trunk_gb / cache_gb overrides the preset's value; auto picks
        the largest preset that fits MemAvailable (or `available`)."""
        preset = self.preset
        if preset == "auto":
            preset = auto_preset(budgets.mem_available() if available is None else available)
        base_trunk, base_cache = PRESETS[preset] if preset else (None, DEFAULT_CACHE_GB)
        return Budget(cache_gb=base_cache if self.cache_gb is None else float(self.cache_gb),
                      trunk_dir=Path(self.trunk) if self.trunk is not None else None,
                      trunk_gb=(base_trunk if self.trunk_gb is None else float(self.trunk_gb)) if self.trunk else None,
                      ring_slots=self.ring, pinned_layers=self.pin_layers, preset=preset)

    def as_dict(self) -> dict:
        """The fields as plain JSON-able values (paths as strings)."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = (str(v) if isinstance(v, os.PathLike) else dict(v) if isinstance(v, Mapping)
                           else v.__dict__.copy() if isinstance(v, PluginOptions) else v)
        return out


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass
class Resolved:
    """An EngineConfig against the installed plugins: the checkpoint's headers opened and checked,
    every plugin chosen, each placer/store with its context. Nothing is loaded yet."""

    config: EngineConfig
    checkpoint: Checkpoint
    kernels: object
    attention: dict                  # kind -> AttentionBackend
    placer: type
    store: type
    placer_ctx: PluginContext
    store_ctx: PluginContext
    notices: list[str]               # one line per installed plugin in use as a default
    # the rows of what the engine holds besides the plugins' (the draft model: model/draft_weights.py), per config
    more_rows: Callable[[EngineConfig], list[PlanRow]] = lambda config: []

    def attention_for(self, layer: int):
        return self.attention[self.checkpoint.config.attention_kind(layer)]

    def plan(self, available: int | None = None) -> Plan:
        """The memory plan; with max_context or prefill_chunk "auto", `config` then holds what was chosen
        (auto_context, auto_chunk)."""
        available = budgets.mem_available() if available is None else available
        if self.config.max_context == "auto":  # the context first: it holds the memory the chunk may have
            first = self.config.replace(prefill_chunk=prefill.DEFAULT_CHUNK) if self.config.prefill_chunk == "auto" \
                else self.config
            self.config = self.config.replace(max_context=auto_context(self, first, available))
        chunk_why = None
        if self.config.prefill_chunk == "auto":
            choice = auto_chunk(self, available)
            self.config, chunk_why = self.config.replace(prefill_chunk=choice.chunk), choice.why
        return self._plan(self.config, available, chunk_why)

    def _plan(self, config: EngineConfig, available: int, chunk_why: str | None = None) -> Plan:
        return Plan(self.placer.plan(self.placer_ctx), self.store.plan(self.store_ctx),
                    state_rows(self.checkpoint.config, self.attention_for, config, chunk_why) + self.more_rows(config),
                    available)


def auto_context(r: Resolved, config: EngineConfig, available: int) -> int:
    """max_context "auto": the model's own limit (tokenizer_config.json's model_max_length, else DEFAULT_CONTEXT),
    within MAX_CONTEXT, halved until the memory plan fits `available` (never below DEFAULT_CONTEXT: a plan that
    does not fit even then is refused as any other, naming --max-context)."""
    limit = context_limit(config.tokenizer or config.model) or DEFAULT_CONTEXT
    context = max(MIN_CONTEXT, min(limit, MAX_CONTEXT))
    while context > DEFAULT_CONTEXT and not r._plan(config.replace(max_context=context), available).fits:
        context = max(DEFAULT_CONTEXT, context // 2)
    return context


def auto_chunk(r: Resolved, available: int) -> prefill.ChunkChoice:
    """prefill_chunk "auto": the chunk plan/prefill.py projects fastest per prompt id for what of this model the plan
    reads per pass (the trunk the placer streams; every expert, unless the store holds them all) and this process's
    cores, at the disk and core rates it assumes, within the memory the rest of the plan leaves."""
    shape = prefill.Shape.of_checkpoint(r.checkpoint)
    where = prefill.where_held(shape, r.placer.streamed_bytes(r.placer_ctx),
                               sum(row.bytes for row in r.store.plan(r.store_ctx)))
    rates = prefill.Rates(prefill.ASSUMED_DISK, r.config.threads or default_threads(),
                          prefill.ASSUMED_MACS_PER_CORE)
    base = r._plan(r.config.replace(prefill_chunk=prefill.DEFAULT_CHUNK), available)
    left = available - base.total + prefill.DEFAULT_CHUNK * shape.activation_bytes
    return prefill.choose_chunk(shape, where, rates, prefill.most_rows(shape, available, left))


def resolve(config: EngineConfig, pm=None) -> Resolved:
    """Choose the plugins `config` names (or the defaults) and open the checkpoint's headers."""
    pm = pm or plugins.get_plugin_manager()
    notices: list[str] = []

    def note(offered, what: str, flag: str, asked: str | None):
        if asked is None and plugins.origin(pm, offered.plugin) != "built-in":
            notices.append(f"k3: using {what} {offered.name!r} from {plugins.origin(pm, offered.plugin)} (an installed "
                           f"plugin, the default here); {flag} NAME picks another")
        return offered.item

    kernels = note(plugins.choose_kernels(pm, config.kernels), "kernel backend", "--kernels",
                   config.kernels or os.environ.get("K3_KERNELS") or None)
    budget = config.budget()
    placer = note(plugins.choose_trunk_placer(pm, config.trunk_placer or ("pinned" if budget.trunk_dir else "resident")),
                  "trunk placer", "--trunk-placer", config.trunk_placer)
    store = note(plugins.choose_expert_store(pm, config.expert_store), "expert store", "--expert-store",
                 config.expert_store)
    checkpoint = open_checkpoint(config.model)
    try:
        kinds = checkpoint.config.attention_kinds
        unknown = sorted(set(config.attention) - set(kinds))
        if unknown:
            raise UsageError(f"attention: this model has no {', '.join(map(repr, unknown))} layers (its kinds: "
                             f"{', '.join(kinds)})")
        attention = {kind: note(plugins.choose_attention_offered(pm, kind, config.attention.get(kind)),
                                f"{kind} attention backend", f"--attention {kind}=", config.attention.get(kind))
                     for kind in kinds}
        resolved = Resolved(config, checkpoint, kernels, attention, placer, store,
                            PluginContext(checkpoint, budget, _options(placer, config.placer_options, "trunk placer")),
                            PluginContext(checkpoint, budget, _options(store, config.store_options, "expert store")),
                            notices)
        check_binding(checkpoint, resolved.attention_for)
    except BaseException:
        checkpoint.close()
        raise
    return resolved


def _options(cls, given, what: str) -> PluginOptions:
    options_cls = getattr(cls, "Options", PluginOptions)
    if not (isinstance(options_cls, type) and issubclass(options_cls, PluginOptions)):
        raise PluginError(f"{what} {cls.name!r}: its Options must be a PluginOptions dataclass")
    field_name = "placer_options" if what == "trunk placer" else "store_options"
    return options_cls.build(given, f"{field_name}: the {what} {cls.name!r}")
