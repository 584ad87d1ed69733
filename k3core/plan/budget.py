"""Memory budgets: the presets, MemAvailable, and the memory plan printed before anything loads.

The plan sums what the chosen trunk placer and expert store say they will hold, what each attention
backend says its decode state takes at the longest context, and working buffers; it refuses what
cannot fit.
"""
from __future__ import annotations

import platform
from dataclasses import dataclass

from ..errors import K3Error, PlanError
from ..interfaces import PlanRow
from ..units import GB, human

# (trunk GB, expert-cache GB), as the C engine offered them (STREAMING-FACTS.md)
PRESETS = {"laptop": (3.0, 1.0), "desktop": (16.0, 10.0), "workstation": (60.0, 30.0),
           "server": (110.0, 13.0), "max": (110.0, 109.0)}
# Python, numpy, the extension and per-layer temporaries, beyond what the plan itemises
WORKING_BYTES = 256 << 20
DEFAULT_CONTEXT = 4096


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


def mem_total() -> int:
    """MemTotal from /proc/meminfo, in bytes (0 where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:")), 0)
    except OSError:
        return 0


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what Python's platform module says."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def auto_preset(available: int) -> str:
    """The largest preset whose budgets plus working memory fit in `available` bytes."""
    fitting = [name for name, (trunk, cache) in PRESETS.items() if (trunk + cache) * GB + WORKING_BYTES <= available]
    if not fitting:
        raise PlanError(f"not even the laptop preset fits in {available / GB:.1f} GB available")
    return max(fitting, key=lambda n: sum(PRESETS[n]))


DRAFT_ROWS = ("draft trunk", "draft decode state")  # the draft model's rows (model/draft_weights.py plan_rows)


@dataclass
class Plan:
    """The memory plan: what the placer, the store and the decode state will hold, before anything loads."""

    trunk: list[PlanRow]                      # the trunk placer's rows
    experts: list[PlanRow]                    # the expert store's rows
    state: list[PlanRow]                      # decode state per attention kind, and working buffers
    available: int = 0

    @property
    def rows(self) -> list[PlanRow]:
        return [*self.trunk, *self.experts, *self.state]

    @property
    def total(self) -> int:
        return sum(r.bytes for r in self.rows)

    @property
    def fits(self) -> bool:
        return self.total <= self.available

    def text(self) -> str:
        width = max(len(r.item) for r in self.rows)
        lines = [f"  {r.item:<{width}}  {human(r.bytes):>9}  {r.detail}" for r in self.rows]
        lines.append(f"  {'total':<{width}}  {human(self.total):>9}  of {human(self.available)} available"
                     + ("" if self.fits else "  — DOES NOT FIT"))
        return "memory plan\n" + "\n".join(lines)

    def to_dict(self) -> dict:
        return {"rows": [{"item": r.item, "bytes": r.bytes, "detail": r.detail} for r in self.rows],
                "total_bytes": self.total, "available_bytes": self.available}

    def check(self) -> None:
        """Refuse a plan that does not fit, saying what to change (with a draft model: what the plan needs without
        it, and the smaller derivation)."""
        if not self.fits:
            draft = sum(r.bytes for r in self.rows if r.item in DRAFT_ROWS)
            without = (f"; the draft model takes {human(draft)}: without --draft-trunk the plan needs "
                       f"{human(self.total - draft)} (an int4 draft, `k3 pack MODEL TRUNK --draft int4`, holds about "
                       "5/8 of an int8 one)") if draft else ""
            raise PlanError("the model does not fit in the memory available with these budgets; lower --trunk-gb or "
                            "--cache-gb, pick a smaller --preset, pack the trunk (k3 pack) to stream it, or lower "
                            "--max-context (a server: --sequences, --prompt-cache-gb; the browser UI: --keep-states)"
                            + without + "\n" + self.text())


def prefill_bytes(c, chunk: int) -> int:
    """The largest per-layer activations of one prefill pass of `chunk` ids, float32: a KDA layer's q, k, v, g
    projections, a MoE layer's router logits, latent input and per-rank expert outputs, and a few H-wide rows."""
    kda = 4 * c.kda_proj_dim
    moe = c.num_experts + c.routed_expert_hidden_size * (1 + c.num_experts_per_token)
    return 4 * chunk * (max(kda, moe) + 6 * c.hidden_size)


def state_rows(config, attention_for, engine_config, chunk_why: str | None = None) -> list[PlanRow]:
    """Each attention kind's decode state at `max_context` positions (times `sequences`), as its backend counts
    it; what a speculation mark holds; and the working set of one pass (`chunk_why`: how "auto" chose it)."""
    e = engine_config
    rows = []
    for kind in config.attention_kinds:
        layers = [L for L in range(config.num_hidden_layers) if config.attention_kind(L) == kind]
        backend = attention_for(layers[0])
        total = sum(backend.state_bytes(config, L, e.max_context) for L in layers)
        each = f", x {e.sequences} sequences" if e.sequences > 1 else ""
        rows.append(PlanRow(f"{kind.upper()} state", total * e.sequences,
                            f"{len(layers)} layers ({backend.name}), {e.max_context} positions of context{each}"))
        if e.kept_states:
            rows.append(PlanRow(f"kept {kind.upper()} states", total * e.kept_states,
                                f"{e.kept_states} decode states kept between requests (--keep-states)"))
    if e.speculate:
        rows.append(speculation_row(config, attention_for, e.speculate, e.sequences))
    if e.prompt_cache_gb:
        rows.append(PlanRow("prompt cache", int(e.prompt_cache_gb * 1e9), "prompt states kept for every "
                            "conversation (--prompt-cache-gb); more on disk with --prompt-cache"))
    if e.speculate and e.draft_memory_gb:
        rows.append(PlanRow("draft index", int(e.draft_memory_gb * 1e9),
                            "what the draft source keeps across conversations (--draft-memory)"))
    pass_rows = max(e.prefill_chunk, e.sequences * (1 + e.speculate))
    return rows + [PlanRow("prefill chunk", prefill_bytes(config, pass_rows),
                           f"activations of {pass_rows} ids per pass (--prefill-chunk, --speculate, --sequences)"
                           + (f"; {chunk_why}" if chunk_why else "")),
                   PlanRow("working buffers", WORKING_BYTES, "Python, numpy, kernel temporaries")]


def speculation_row(config, attention_for, k: int, sequences: int = 1) -> PlanRow:
    """What a verify pass of 1 + k positions keeps for its rollback, over every layer, for each sequence."""
    layers = range(config.num_hidden_layers)
    try:
        at_mark = sum(attention_for(L).rollback_bytes(config, L, 0) for L in layers)
        total = sum(attention_for(L).rollback_bytes(config, L, 1 + k) for L in layers)
    except NotImplementedError as exc:
        raise PlanError(f"speculate: {exc}; use speculate 0") from None
    each = f", x {sequences} sequences" if sequences > 1 else ""
    return PlanRow("speculation rollback", total * sequences, f"decode state at the mark {human(at_mark)} + "
                   f"{human((total - at_mark) / (1 + k))} per verified position, {1 + k} positions (--speculate {k})"
                   + each)
