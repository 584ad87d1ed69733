"""A whole tune: what can matter for this model and budget (knobs.py), the search over it (search.py), each trial in
a process of its own (trial.py), and the result as the profile keeps it (plan/tuned.py `Tuned`)."""
from __future__ import annotations

import importlib
import math
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Callable, Mapping, Sequence

from .. import plugin_manager
from ..errors import UnsoundRunError, UsageError
from ..interfaces import KernelBackend, default_threads
from ..io.caching_store import all_experts
from ..io.codec import RAW
from ..io.draft_trunk import KINDS, default_dir
from ..io.expert_io import expert_slot_bytes
from ..io.trunk import load_trunk
from ..plan.engine_config import EngineConfig, resolve
from ..plan.tuned import Tuned, fingerprint
from . import knobs as K
from .search import PHASES, Outcome, Search, Trial

SPLIT_SHARES = (0, 1, 2, 3, 4)  # quarters of the layers pinned, for the trunk_gb knob


@dataclass(frozen=True)
class Workload:
    prompts: tuple[tuple[int, ...], ...]   # run one after another, each from a fresh state
    reply: int                              # ids generated for each (no stop: every trial does the same work)


def shape_of(base: EngineConfig, workload: Workload, plugins: Sequence = ()) -> K.Shape:
    """What decides which knobs can matter, read from the checkpoint's headers and the memory plans; `plugins`:
    plugin modules besides the installed ones."""
    r = resolve(base, plugin_manager.new_plugin_manager(plugins) if plugins else plugin_manager.get_plugin_manager())
    try:
        c = r.checkpoint.config
        plan = r.plan()
        experts_held = sum(row.bytes for row in plan.experts if row.item == "expert cache")
        every_expert = all_experts(c) * expert_slot_bytes(r.checkpoint)
        streams = base.trunk is not None and r.placer.streamed_bytes(r.placer_ctx) > 0
        options = frozenset(getattr(r.store.Options, "__dataclass_fields__", {}))
        family = type(r.kernels).set_family_threads is not KernelBackend.set_family_threads
        coded = streams and "pin_coded" in getattr(r.placer.Options, "__dataclass_fields__", {}) \
            and load_trunk(base.trunk, r.checkpoint).codec != RAW
        layers = c.num_hidden_layers
        expert_kib = expert_slot_bytes(r.checkpoint) // 1024
    finally:
        r.checkpoint.close()
    budget = base.budget()
    total = round(budget.trunk_gb + budget.cache_gb, 3) if base.trunk is not None else None
    splits = _splits(base, layers, total, plugins) if total is not None else ()
    return K.Shape(cores=default_threads(), layers=layers, trunk_streams=streams,
                   experts_stream=experts_held < every_expert, store_options=options, budget_gb=total,
                   splits=splits, longest_prompt=max(map(len, workload.prompts)),
                   has_family_threads=family, coded_trunk=coded,
                   trunk_gb=budget.trunk_gb or 0.0, cache_gb=budget.cache_gb, prompt_cache_gb=base.prompt_cache_gb,
                   draft_gb=_draft_gb(base, plugins), top_k=c.num_experts_per_token, expert_kib=expert_kib,
                   conversation=len(workload.prompts) > 1)


def _draft_gb(base: EngineConfig, plugins: Sequence) -> dict:
    """Each draft trunk a tune may try -> the GB of its weights as the memory plan holds them: the one --draft-trunk
    names, and the other kind packed beside the trunk when it names a kind (int8, int4)."""
    from ..api import memory_plan

    if base.draft_trunk is None:
        return {}
    given = str(base.draft_trunk)
    names = [given] + [k for k in KINDS if given in KINDS and k != given and default_dir(base.trunk, k).is_dir()]
    return {name: round(sum(row.bytes for row in memory_plan(base.replace(draft_trunk=name), plugins=plugins).rows
                            if row.item in DRAFT_ROWS) / 1e9, 3) for name in names}


DRAFT_ROWS = ("draft trunk",)  # its weights (model/draft_weights.py plan_rows); its decode state, like the model's,
                               # grows with the context, not from the budget the tune splits


def _splits(base: EngineConfig, layers: int, total: float, plugins: Sequence) -> tuple:
    """The trunk GB that pins 0, ¼, ½, ¾ and all layers (the ring included), those within `total`, after the
    untuned split itself; a value less than half a layer from one before it pins the same layers: left out."""
    from ..api import memory_plan

    def trunk_gb(pinned: int) -> float:
        config = base.replace(preset=None, trunk_gb=None, cache_gb=None, pin_layers=pinned)
        return round(sum(row.bytes for row in memory_plan(config, plugins=plugins).trunk) / 1e9 + 0.001, 3)

    each = [trunk_gb(layers * share // 4) for share in SPLIT_SHARES]
    half_layer = (each[-1] - each[0]) / layers / 2
    values = [round(base.budget().trunk_gb, 3)]
    for gb in each:
        if gb <= total and all(abs(gb - v) >= half_layer for v in values):
            values.append(gb)
    return tuple(values)


def tune(base: EngineConfig, workload: Workload, *, minutes: float, only: Sequence[str] = (), grid: bool = False,
         plugins: Sequence[str] = (), min_trial_seconds: float | None = None,
         on_trial: Callable[[Trial, Trial | None, Mapping], object] = lambda t, b, s: None,
         on_start: Callable[[K.Shape, list, list], object] = lambda shape, knobs, left: None) -> Outcome:
    """Search the settings of `base` for the fastest run of `workload` within `minutes`. `only`: knob names to
    turn (the rest stay untuned); `grid`: every combination instead of the descent; `plugins`: modules each trial
    imports and passes to open_engine (a plugin not installed); a trial runs the workload again (in a new process)
    until it has lasted `min_trial_seconds` (default MIN_TRIAL_SECONDS), and keeps the fastest run. Ctrl-C ends
    it: Interrupted then holds what was measured."""
    shape = shape_of(base, workload, [importlib.import_module(name) for name in plugins])
    start = K.start_setting(base, shape)
    knobs, left = K.knobs_for(shape, start)
    if only:
        unknown = sorted(set(only) - {k.name for k in knobs})
        if unknown:
            raise UsageError(f"--knobs: {', '.join(unknown)} cannot be turned here (the knobs here: "
                             f"{', '.join(k.name for k in knobs)})")
        knobs = [k for k in knobs if k.name in only]
    on_start(shape, knobs, left)

    repeats: dict[str, int] = {}  # phase -> runs that make a trial: set by its first, to last MIN_TRIAL_SECONDS
    states = tempfile.TemporaryDirectory(prefix="k3-tune-states-")  # the prompts' states, for the decode trials

    def measure(setting: Mapping, phase: str) -> Trial:
        from .trial import measure as run

        if (cache := shape.cache_gb_for(setting)) < 0:
            return Trial(dict(setting), skipped=f"does not fit: it leaves the expert cache {cache:g} GB of the budget")
        config, spec = K.engine_config(base, setting, shape)
        job = {"config": config.as_dict(), "speculation": spec, "prompts": [list(p) for p in workload.prompts],
               "reply": workload.reply, "plugins": list(plugins), "states": states.name,
               "resume": phase == "decode", "conversation": phase == "turn"}
        runs = [run(job, setting)]
        if runs[0].seconds is None:
            return runs[0]
        if phase not in repeats:
            least = MIN_TRIAL_SECONDS if min_trial_seconds is None else min_trial_seconds
            repeats[phase] = min(MAX_REPEATS, max(1, math.ceil(least / runs[0].seconds)))
        runs += [run(job, setting) for _ in range(repeats[phase] - 1)]
        return fastest(runs, K.describe(setting, start) or "the untuned settings")

    search = Search(measure, time.monotonic() + minutes * 60, on_trial)
    try:
        with states:
            return search.grid(knobs, start) if grid else search.descend(knobs, start)
    except KeyboardInterrupt:
        if search.outcome is None or not search.outcome.trials:
            raise
        search.outcome.complete = False
        raise Interrupted(search.outcome) from None


MIN_TRIAL_SECONDS = 1.0  # a workload faster than this is run again (each run its own process) and the fastest kept
MAX_REPEATS = 5


def fastest(runs: list[Trial], name: str) -> Trial:
    """One setting's runs as one trial, costing them all: each figure a phase is judged by (search.PHASES) and the
    wall time the least any run took. Runs that disagree on an id are a bug (exit 4)."""
    odd = next((r for r in runs if r.ids != runs[0].ids), None)
    if odd is not None:
        raise UnsoundRunError(f"k3 tune: {name} gave other ids on a second run of the same workload: ids must "
                              "never depend on the run. This is a bug in k3 or in a plugin: please report it")
    best = min(runs, key=lambda r: r.seconds)
    least = {f: min(r.figures[f] for r in runs) for f in PHASES.values() if all(r.figures.get(f) for r in runs)}
    return replace(best, took=sum(r.took for r in runs), figures={**best.figures, **least, "runs": len(runs)})


PROMPTS = {"prefill": "forwarded", "decode": "resumed", "turn": "conversation"}  # how each phase's trials start


class Interrupted(Exception):
    """Ctrl-C during a tune: what was measured up to then."""

    def __init__(self, outcome: Outcome):
        super().__init__("interrupted")
        self.outcome = outcome


def tuned_result(base: EngineConfig, shape: K.Shape, outcome: Outcome, workload: Workload, started: float) -> Tuned:
    """The outcome as the profile keeps it."""
    best, start = outcome.best, outcome.start
    spec = None if best["draft"] == "off" else {"draft": best["draft"], "k": best["speculate"]}
    if spec and spec["draft"] in K.MODEL_DRAFTS:  # they draft with the model on its draft trunk
        spec["draft_trunk"] = str(best["draft_trunk"])
        if best["draft_topk"] is not None:
            spec["draft_topk"] = best["draft_topk"]
    reference = next(t for t in outcome.trials if t.seconds is not None)
    measured = {"seconds_per_token": {"untuned": outcome.mean(start, "decode"), "tuned": outcome.mean(best, "decode")},
                "prefill_seconds": {"untuned": outcome.mean(start, "prefill"), "tuned": outcome.mean(best, "prefill")},
                "turn_seconds": {"untuned": outcome.mean(start, "turn"), "tuned": outcome.mean(best, "turn")},
                "gain": outcome.gain("decode"), "prefill_gain": outcome.gain("prefill"),
                "turn_gain": outcome.gain("turn"), "complete": outcome.complete,
                "minutes": round((time.monotonic() - started) / 60, 2), "kernels": reference.figures.get("kernels"),
                "workload": {"prompts": len(workload.prompts), "prompt_ids": [len(p) for p in workload.prompts],
                             "reply_ids": workload.reply}}
    trials = [{"changed": K.describe(t.setting, start) or "(untuned)", "prompts": PROMPTS[t.phase],
               "seconds": t.seconds, "skipped": t.skipped, "seconds_per_token": t.score("decode"),
               "prefill_seconds": t.score("prefill"), "turn_seconds": t.score("turn")}
              for t in outcome.trials + outcome.confirm]
    return Tuned(K.saved_engine(base, best, start, shape), spec, measured,
                 datetime.now(timezone.utc).isoformat(timespec="seconds"), fingerprint(base.model), str(base.model),
                 trials)
