"""Tuned settings (`k3 tune` measures them; the saved profile keeps them): the engine fields and the speculation
that ran fastest on this machine, what was measured, when, and on which machine.

A profile's tuning applies where a run uses the profile's model and nothing more specific was asked: every field a
flag or an override sets keeps that value. Tuning measured on another machine (another CPU, CPU count, RAM or the
disk under the model) is not applied; `machine_changes` says what differs, so `k3 doctor` and the run itself can
suggest `k3 tune` again.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping

from ..errors import UsageError
from ..files.device import stat_file
from ..interfaces import default_threads
from .budget import cpu_name, mem_total

# the EngineConfig fields a tune may set (what `engine` holds), and the budgets set together
ENGINE_FIELDS = ("threads", "kernel_threads", "ring", "trunk_gb", "cache_gb", "prefill_chunk", "prompt_cache_gb",
                 "store_options", "placer_options")
MAPPINGS = ("kernel_threads", "store_options", "placer_options")  # merged key by key, the keys given winning
BUDGET_FIELDS = ("preset", "trunk_gb", "cache_gb")


@dataclass(frozen=True)
class Tuned:
    """What a tune chose and why."""

    engine: Mapping                  # EngineConfig field -> value (ENGINE_FIELDS only)
    speculation: Mapping | None      # {"draft", "k": K | "auto"[, "draft_trunk", "draft_topk"]}; None: none was fastest
    measured: Mapping                # untuned and tuned s/token and prompt seconds, the gains, the workload, complete
    when: str                        # ISO 8601, UTC
    machine: Mapping                 # fingerprint() of the machine it ran on
    model: str                       # the model directory it tuned
    trials: list = field(default_factory=list)  # every candidate measured: its settings, seconds, or why not

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data, source: str) -> "Tuned":
        """A saved tuning; a damaged one is a UsageError naming `source` and the field."""
        if not isinstance(data, Mapping):
            raise UsageError(f"{source}: tuned: must be an object, got {type(data).__name__}")
        problems = [name for name, kind in (("engine", Mapping), ("measured", Mapping), ("machine", Mapping),
                                            ("when", str), ("model", str), ("trials", list))
                    if not isinstance(data.get(name), kind)]
        unknown = sorted(set(data.get("engine") or {}) - set(ENGINE_FIELDS)) if not problems else []
        spec = data.get("speculation")
        if spec is not None and not (isinstance(spec, Mapping) and isinstance(spec.get("draft"), str)
                                     and (spec.get("k") == "auto" or isinstance(spec.get("k"), int))
                                     and isinstance(spec.get("draft_trunk", ""), str)
                                     and isinstance(spec.get("draft_topk", 1), int)):
            problems.append("speculation")
        if problems or unknown:
            raise UsageError(f"{source}: tuned: bad {', '.join(problems + [f'engine.{u}' for u in unknown])}; run "
                             "`k3 tune` again")
        return cls(dict(data["engine"]), dict(spec) if spec else None, dict(data["measured"]), data["when"],
                   dict(data["machine"]), data["model"], list(data["trials"]))

    def fill(self, fields: dict) -> dict:
        """`fields` (EngineConfig keyword arguments) with each tuned field that is None there set; the budgets only
        when none of preset / trunk_gb / cache_gb was given; MAPPINGS merged under the ones given."""
        out = dict(fields)
        budgets_given = any(out.get(k) is not None for k in BUDGET_FIELDS)
        for name, value in self.engine.items():
            if name in BUDGET_FIELDS and budgets_given:
                continue
            if name in MAPPINGS:
                out[name] = {**value, **(out.get(name) or {})}
            elif out.get(name) is None:
                out[name] = value
        if not budgets_given and ("trunk_gb" in self.engine or "cache_gb" in self.engine):
            out["preset"] = None
        return out

    def summary(self) -> str:
        """One line: the settings and the gain (`threads 2, ring 3, …: 1.18× the preset's speed`)."""
        parts = [f"{k.replace('_', ' ')} {_show(v)}" for k, v in self.engine.items()]
        spec = self.speculation
        if spec:
            parts.append(f"speculate {spec['k']} with {spec['draft']}"
                         + (f" (draft trunk {spec['draft_trunk']}" if spec.get("draft_trunk") else "")
                         + (f", {spec['draft_topk']} experts per token" if spec.get("draft_topk") else "")
                         + (")" if spec.get("draft_trunk") else ""))
        parts = parts or ["k3's defaults (nothing measured faster)"]
        gain, turns = self.measured.get("gain"), self.measured.get("turn_gain")
        return ", ".join(parts) + (f": {gain:.2f}× the untuned speed per token" if isinstance(gain, (int, float))
                                   else "") + (f", a conversation in {1 / turns:.2f}× its time"
                                               if isinstance(turns, (int, float)) and turns else "")


def _show(value) -> str:
    if isinstance(value, Mapping):
        return ",".join(f"{k}={_show(v)}" for k, v in value.items()) or "-"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g} GB" if isinstance(value, float) else str(value)


def fingerprint(model_dir) -> dict:
    """What tuned settings depend on: the CPU, the CPUs this process may use, the RAM, and the disk under
    `model_dir` (its block device and, where sysfs says, its model name and whether it spins)."""
    return {"cpu": cpu_name(), "cpus": default_threads(), "ram_gb": round(mem_total() / 1e9),
            "disk": _disk(model_dir)}


def machine_changes(saved: Mapping, now: Mapping) -> list[str]:
    """What differs between two fingerprints, one phrase each (`CPU AMD EPYC 7B13 → Intel …`)."""
    names = {"cpu": "CPU", "cpus": "CPUs", "ram_gb": "RAM GB", "disk": "disk"}
    return [f"{names.get(k, k)} {saved.get(k)} → {now.get(k)}" for k in names if saved.get(k) != now.get(k)]


def _disk(model_dir) -> str:
    """`vda`, `nvme0n1p2 (Samsung SSD 980, solid state)`; `unknown` where /sys says nothing."""
    try:
        stat = stat_file(model_dir)
    except OSError:
        return "unknown"
    if stat is None:
        return "unknown"
    device = stat.parent.resolve()
    disk = device if (device / "device").exists() else device.parent  # a partition's disk is its parent
    model = _read(disk / "device" / "model")
    rotational = _read(disk / "queue" / "rotational")
    kind = {"0": "solid state", "1": "spinning"}.get(rotational)
    details = ", ".join(x for x in (model, kind) if x)
    return f"{device.name} ({details})" if details else device.name


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def same_model(a, b) -> bool:
    """Whether two model directories are one (the same directory, however named)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def tuning_for(profile, model_dir=None) -> tuple[Tuned | None, str | None]:
    """The profile's tuning if it applies to a run of `model_dir` (None: the profile's own model) on this machine,
    and a line to show: what is used, or why not (another machine: what changed, and `k3 tune`)."""
    if profile is None or not profile.tuned:
        return None, None
    if model_dir is not None and not same_model(model_dir, profile.model):
        return None, None
    tuned = Tuned.from_dict(profile.tuned, "the saved profile")
    changed = machine_changes(tuned.machine, fingerprint(profile.model))
    if changed:
        return None, (f"k3: the saved tuning ({tuned.when[:10]}) was measured on another machine ({'; '.join(changed)})"
                      ": not used; `k3 tune` measures this one")
    return tuned, (f"k3: tuned settings from {tuned.when[:10]} (`k3 tune`; a flag overrides its field): "
                   f"{tuned.summary()}")
