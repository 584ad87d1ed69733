"""What every plugin kind shares: its name and description (Plugin); for the kinds built from a checkpoint, the
context they are given (budgets, their own options), the memory plan's rows and the call order (ContextPlugin);
the read and wait seconds their counters give."""
from __future__ import annotations

import math
import typing
from abc import ABC
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Mapping, NamedTuple

from ..errors import UsageError


@dataclass(frozen=True)
class PluginOptions:
    """A trunk placer's or expert store's own options: subclass it as a frozen dataclass whose fields
    all have defaults, and name the subclass in the plugin's `Options`. The base has no fields: a
    plugin that keeps it takes no options."""

    @classmethod
    def build(cls, given, owner: str) -> "PluginOptions":
        """`given` (a mapping, an instance of this class, or None) checked and turned into an instance.
        An unknown name or a wrong type is a UsageError naming it and the valid options."""
        if isinstance(given, cls):
            return given
        if isinstance(given, PluginOptions):
            raise UsageError(f"{owner} takes {cls.__qualname__} options, got {type(given).__qualname__}")
        if given is not None and not isinstance(given, Mapping):
            raise UsageError(f"{owner}: options must be a mapping of name to value, got {type(given).__name__}")
        given = dict(given or {})
        hints = typing.get_type_hints(cls)
        known = [f.name for f in fields(cls)]
        valid = (f"its options are: {', '.join(f'{n} ({_type_name(hints[n])})' for n in known)}" if known
                 else "it takes no options")
        unknown = sorted(set(given) - set(known), key=str)
        if unknown:
            raise UsageError(f"{owner} has no option {', '.join(map(repr, unknown))}; {valid}")
        wrong = [f"{name} must be {_type_name(hints[name])}, got {value!r}" for name, value in given.items()
                 if not _has_type(value, hints[name])]
        missing = [f.name for f in fields(cls) if f.name not in given and f.default is MISSING
                   and f.default_factory is MISSING]
        if missing:
            wrong.append(f"{', '.join(missing)} must be given (no default)")
        if wrong:
            raise UsageError(f"{owner}: " + "; ".join(wrong))
        return cls(**given)


def _type_name(kind) -> str:
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if args:
        return " or ".join(_type_name(a) for a in args) + (" or None" if type(None) in typing.get_args(kind) else "")
    return getattr(kind, "__name__", str(kind))


def _has_type(value, kind) -> bool:
    args = typing.get_args(kind)
    if args:
        return any(_has_type(value, a) for a in args)
    if kind is type(None):
        return value is None
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind) if isinstance(kind, type) else True


@dataclass(frozen=True)
class Budget:
    """The memory budgets in force, presets already applied (EngineConfig.budget())."""

    cache_gb: float                    # the expert store's RAM
    trunk_dir: Path | None = None      # the packed trunk (`k3 pack`), None when there is none
    trunk_gb: float | None = None      # pinned trunk layers + the ring; None: no limit
    ring_slots: int = 2                # slots of the streaming ring
    pinned_layers: int | None = None   # pin exactly this many layers instead of what trunk_gb holds
    preset: str | None = None          # the preset the numbers came from, if any


@dataclass(frozen=True)
class PluginContext:
    """What a trunk placer or an expert store is built from: the opened checkpoint (`root`, `config`,
    `index`: tensor name -> file, offset, nbytes, shape, dtype), the budgets, and its own options."""

    checkpoint: Any
    budget: Budget
    options: PluginOptions

    @property
    def config(self):
        return self.checkpoint.config


class PlanRow(NamedTuple):
    """One line of the memory plan: what is held, how many bytes, and how that was counted."""

    item: str
    bytes: int
    detail: str


def io_seconds(stats: Mapping) -> tuple[float, float]:
    """(seconds with a trunk or expert read in flight, seconds the forward passes stood waiting for one) in an
    engine's stats (STORE_STATS, PLACER_STATS); a store that does not count its waits waited for every read."""
    read = stats.get("trunk_read_seconds", 0.0) + stats.get("expert_read_seconds", 0.0)
    return read, stats.get("trunk_wait_seconds", 0.0) + stats.get("expert_wait_seconds",
                                                                   stats.get("expert_read_seconds", 0.0))


class Plugin(ABC):
    """What every plugin kind has: the name users pick it by (--kernels, --attention, --expert-store,
    --trunk-placer, --draft) and a one-line description (`k3 plugins`)."""

    name: ClassVar[str]
    description: ClassVar[str] = ""


class ContextPlugin(Plugin):
    """The kinds built from the opened checkpoint and the budgets (an expert store, a trunk placer).

    Call order: `plan(ctx)` (before anything loads; it may be called without the plugin ever being built),
    `__init__(ctx)`, the kind's own calls, `stats()` any time, `close()` once."""

    Options: ClassVar[type[PluginOptions]] = PluginOptions

    @classmethod
    def plan(cls, ctx: PluginContext) -> list[PlanRow]:
        """What this plugin would hold in RAM, for the memory plan."""
        return []

    def __init__(self, ctx: PluginContext):
        self.ctx, self.checkpoint, self.config, self.options = ctx, ctx.checkpoint, ctx.config, ctx.options

    def stats(self) -> dict:
        """Counters under the names plugin_api lists for the kind (STORE_STATS, PLACER_STATS)."""
        return {}

    def close(self) -> None:
        """Release files and buffers."""
