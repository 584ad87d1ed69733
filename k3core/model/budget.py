"""Memory budgets: the presets, MemAvailable, and the memory plan printed before anything loads.

The plan sums what the chosen trunk placer and expert store say they will hold, plus the decode
state, the MLA cache at the longest context, and working buffers; it refuses what cannot fit.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import K3Error

GB = 1e9
# (trunk GB, expert-cache GB), as the C engine offered them (STREAMING-FACTS.md)
PRESETS = {"laptop": (3.0, 1.0), "desktop": (16.0, 10.0), "workstation": (60.0, 30.0),
           "server": (110.0, 13.0), "max": (110.0, 109.0)}
# Python, numpy, the extension and per-layer temporaries, beyond what the plan itemises
WORKING_BYTES = 256 << 20
DEFAULT_CONTEXT = 4096


def human(n: float) -> str:
    """Bytes in decimal units that keep three significant digits (1.23 GB, 45.6 MB, 789 kB)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            text = f"{n / size:.3g}"
            return f"{text if 'e' not in text else f'{n / size:.0f}'} {unit}"
    return f"{int(n)} B"


class PlanError(K3Error):
    """The memory plan does not fit in the memory available."""

    exit_code = 2


def mem_available() -> int:
    """MemAvailable from /proc/meminfo, in bytes."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    raise K3Error("cannot read MemAvailable from /proc/meminfo; give --trunk-gb and --cache-gb")


def auto_preset(available: int) -> str:
    """The largest preset whose budgets plus working memory fit in `available` bytes."""
    fitting = [name for name, (trunk, cache) in PRESETS.items() if (trunk + cache) * GB + WORKING_BYTES <= available]
    if not fitting:
        raise PlanError(f"not even the laptop preset fits in {available / GB:.1f} GB available")
    return max(fitting, key=lambda n: sum(PRESETS[n]))


@dataclass(frozen=True)
class Budget:
    preset: str | None
    trunk_gb: float | None  # None: no limit given (the resident placer holds everything)
    cache_gb: float


def resolve_budget(preset: str | None, trunk_gb: float | None, cache_gb: float | None,
                   available: int | None = None) -> Budget:
    """Explicit --trunk-gb / --cache-gb override the preset's values."""
    if preset == "auto":
        preset = auto_preset(mem_available() if available is None else available)
    if preset is not None and preset not in PRESETS:
        raise PlanError(f"unknown preset {preset!r}; choose one of {', '.join([*PRESETS, 'auto'])}")
    base_trunk, base_cache = PRESETS[preset] if preset else (None, 1.0)
    return Budget(preset, base_trunk if trunk_gb is None else trunk_gb, base_cache if cache_gb is None else cache_gb)


@dataclass
class Plan:
    rows: list = field(default_factory=list)  # (item, bytes, detail)
    available: int = 0

    @property
    def total(self) -> int:
        return sum(b for _, b, _ in self.rows)

    @property
    def fits(self) -> bool:
        return self.total <= self.available

    def text(self) -> str:
        width = max(len(item) for item, _, _ in self.rows)
        lines = [f"  {item:<{width}}  {human(b):>9}  {detail}" for item, b, detail in self.rows]
        lines.append(f"  {'total':<{width}}  {human(self.total):>9}  of {human(self.available)} available"
                     + ("" if self.fits else "  — DOES NOT FIT"))
        return "memory plan\n" + "\n".join(lines)

    def to_dict(self) -> dict:
        return {"rows": [{"item": i, "bytes": b, "detail": d} for i, b, d in self.rows],
                "total_bytes": self.total, "available_bytes": self.available}


def state_rows(config, max_context: int) -> list[tuple[str, int, str]]:
    c = config
    kda = [L for L in range(c.num_hidden_layers) if not c.is_mla(L)]
    mla = c.num_hidden_layers - len(kda)
    per_kda = (c.kda_num_heads * c.kda_head_dim ** 2 + 3 * (c.short_conv_kernel_size - 1) * c.kda_proj_dim) * 4
    per_position = mla * (c.kv_lora_rank + c.qk_rope_head_dim) * 4
    return [("KDA state", len(kda) * per_kda, f"{len(kda)} layers × {human(per_kda)} (state + conv history)"),
            ("MLA cache", per_position * max_context,
             f"{mla} layers × {c.kv_lora_rank + c.qk_rope_head_dim} floats = {per_position} B/position, "
             f"{max_context} positions"),
            ("working buffers", WORKING_BYTES, "Python, numpy, kernel temporaries")]


def memory_plan(checkpoint, placer_cls, store_cls, options: dict, max_context: int = DEFAULT_CONTEXT,
                available: int | None = None) -> Plan:
    c = checkpoint.config
    rows = placer_cls.plan(checkpoint, c, options) + store_cls.plan(checkpoint, c, options)
    return Plan(rows + state_rows(c, max_context), mem_available() if available is None else available)


def check_plan(plan: Plan) -> None:
    if not plan.fits:
        raise PlanError("the model does not fit in the memory available with these budgets; lower --trunk-gb or "
                        "--cache-gb, pick a smaller --preset, pack the trunk (k3 pack) to stream it, or lower "
                        "--max-context\n" + plan.text())
