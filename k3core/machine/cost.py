"""What a token of the full Kimi K3 costs on a given machine, from measured rates: the bytes it reads and
the CPU it spends, by trunk codec, RAM size and draft length. `k3 bench stream` projects from the rates of its
own run, `k3 bench project` tabulates RAM sizes; `k3 setup` picks the codec its machine runs faster
(choose_codec).

The method (docs/PERFORMANCE.md, "The real model by RAM, projected"; docs/performance-notes/projection-by-ram.md):

* a pass of T rows (one serial token, or a verify pass of K drafts: T = K + 1) reads the trunk once — the part
  of it not pinned in RAM, at its stored ratio — and, in each of the 92 MoE layers, the union of the experts its
  rows route to: one token's 1,472 experts (25.83 GB) × the union ratio of T consecutive tokens on the real
  model's routing trace (K3_UNION). No cache hits: the router balances experts, and the C engine read all
  25.83 GB per token at every RAM size up to 64 GB (STREAMING-FACTS);
* its CPU: restoring every coded trunk byte it uses (streamed, or pinned coded) at the decode rate per core,
  plus the kernels over every weight byte it touches at the kernel rate per core, each row past the first
  costing a fraction of the first (ROW_COST_*), spread over all cores;
* its seconds = max(disk time, CPU time) × an overhead (a streamed floor run's s/token ÷ its disk floor, ≥ 1);
* a token costs a pass ÷ the tokens a pass yields (1 serially; measured per K for a draft source).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..plan.prefill import K3_UNION, union_ratio  # the real model's expert unions (its routing trace)

K3_TRUNK_BYTES = 108.81e9
K3_HEAD_BYTES = 2.35e9
K3_LAYERS = 93
K3_LAYER_BYTES = K3_TRUNK_BYTES / K3_LAYERS  # 1.17 GB: what a pinned layer or a ring slot holds, restored
K3_EXPERTS_PER_TOKEN = 16 * 92
K3_EXPERT_BYTES = 17_547_264
TOKEN_EXPERT_BYTES = K3_EXPERTS_PER_TOKEN * K3_EXPERT_BYTES  # 25.83 GB
PLANES_RATIO = 0.6726         # `k3 pack --codec planes` on `k3 make-model --shape wide` (the real trunk's is
                              # not measurable here; its BF16 weights are the same kind of bytes)
RING_BYTES = 2 * K3_LAYER_BYTES  # the two-slot ring a streamed trunk passes through
RAM_BESIDES_TRUNK = 5e9       # of 8 GB, what the laptop preset (3 GB of trunk) leaves for the expert slots,
                              # decode state, working memory and the system: the same at every RAM size,
                              # the rest to the trunk (STREAMING-FACTS: trunk before cache)
# what each row of a pass past the first costs in kernel time, in first rows: `k3 bench kernels` on this
# machine (docs/performance-notes/small-gemms.md, 2 threads, T = 8: bf16 2.80x and MXFP4 1.75x the
# tokens/s of one row, so 8 rows take 2.86 and 4.57 rows' time); for T < 8 it overstates the CPU
ROW_COST_BF16 = (8 / 2.80 - 1) / 7
ROW_COST_MXFP4 = (8 / 1.75 - 1) / 7


@dataclass(frozen=True)
class Machine:
    disk: float                # bytes/s
    cores: int
    decode_per_core: float     # restored bytes/s of the lossless trunk, one core
    compute_per_core: float    # weight bytes/s a token's kernels get through, per core
    overhead: float = 1.0      # a streamed run's s/token ÷ its disk floor (at least 1)


@dataclass(frozen=True)
class Layout:
    """Where the trunk lives: `pinned` of its 93 layers held in RAM (restored, or `coded`: as stored, restored
    on every use), lm_head too when `head_pinned`, the rest streamed, stored at `ratio` of its bytes."""
    ratio: float
    pinned: int = 0
    coded: bool = False
    head_pinned: bool = False

    @property
    def streamed(self) -> float:
        """Restored trunk bytes read from disk per pass."""
        return (K3_LAYERS - self.pinned) * K3_LAYER_BYTES + (0.0 if self.head_pinned else K3_HEAD_BYTES)

    @property
    def restored(self) -> float:
        """Trunk bytes restored per pass: all of a coded trunk's when pinned layers are held coded."""
        if self.ratio == 1:
            return 0.0
        return K3_TRUNK_BYTES + K3_HEAD_BYTES if self.coded else self.streamed

    @property
    def name(self) -> str:
        codec = "raw" if self.ratio == 1 else "planes"
        held = "all" if self.head_pinned else f"{self.pinned} of 93"
        return f"{codec}, {held} layers pinned" + (" coded" if self.coded and self.pinned else "")


def layout_for(ram: float, ratio: float, coded: bool = False) -> Layout:
    """The trunk at `ram` bytes of RAM: every layer and lm_head pinned if they fit in what the trunk gets,
    else as many layers as fit beside the ring."""
    held = ratio if coded else 1.0
    budget = ram - RAM_BESIDES_TRUNK
    if (K3_TRUNK_BYTES + K3_HEAD_BYTES) * held <= budget:
        return Layout(ratio, K3_LAYERS, coded, head_pinned=True)
    fit = int((budget - RING_BYTES) // (K3_LAYER_BYTES * held))
    return Layout(ratio, max(0, min(K3_LAYERS, fit)), coded)


def pass_cost(layout: Layout, machine: Machine, rows: float = 1.0, unions=K3_UNION) -> dict:
    """Bytes read, disk and CPU seconds and seconds of one pass of `rows` rows."""
    union = union_ratio(rows, unions)
    read = layout.streamed * layout.ratio + TOKEN_EXPERT_BYTES * union
    kernels = ((K3_TRUNK_BYTES + K3_HEAD_BYTES) * (1 + ROW_COST_BF16 * (rows - 1))
               + TOKEN_EXPERT_BYTES * (union + ROW_COST_MXFP4 * (rows - union)))
    cpu = (layout.restored / machine.decode_per_core + kernels / machine.compute_per_core) / machine.cores
    return {"rows": rows, "union": union, "bytes_read": read, "disk_seconds": read / machine.disk,
            "cpu_seconds": cpu, "seconds": max(read / machine.disk, cpu) * machine.overhead}


@dataclass(frozen=True)
class Drafts:
    """What a draft source gave at one K: ids per pass, and rows per pass (1 + drafted ids ÷ passes)."""
    k: int
    tokens_per_pass: float
    rows_per_pass: float


def per_token(layout: Layout, machine: Machine, drafts: Drafts | None = None, unions=K3_UNION) -> dict:
    """A token's bytes and seconds: one pass serially, a verify pass ÷ its tokens per pass with `drafts`."""
    rows, tokens = (drafts.rows_per_pass, drafts.tokens_per_pass) if drafts else (1.0, 1.0)
    p = pass_cost(layout, machine, rows, unions)
    return {"layout": layout.name, "k": drafts.k if drafts else 0, "tokens_per_pass": tokens, **p,
            "bytes_per_token": p["bytes_read"] / tokens, "seconds_per_token": p["seconds"] / tokens}


def fastest(layouts, machine: Machine, drafts: list[Drafts] | None = None, unions=K3_UNION) -> dict:
    """per_token of the layout (and K, of `drafts`) with the fewest projected seconds per token."""
    return min((per_token(layout, machine, d, unions) for layout in layouts for d in (drafts or [None])),
               key=lambda r: r["seconds_per_token"])


def projection(ratio: float, decode_per_core: float, compute_per_core: float, overhead: float, cores: int,
               disk: float = 7e9) -> dict:
    """Full K3 at 8 GB of RAM (the laptop preset: the whole trunk streams) with `cores` cores and a disk of `disk`
    bytes/s, for a trunk stored at `ratio` of its bytes (1: raw), restored at `decode_per_core` and computed at
    `compute_per_core` bytes/s per core."""
    p = pass_cost(Layout(ratio), Machine(disk, cores, decode_per_core, compute_per_core, overhead))
    return {"cores": cores, "disk_bytes_per_second": disk, "bytes_read_per_token": p["bytes_read"],
            "disk_seconds": p["disk_seconds"], "cpu_seconds": p["cpu_seconds"], "overhead": overhead,
            "seconds_per_token": p["seconds"]}


@dataclass(frozen=True)
class CodecChoice:
    codec: str                # "raw" or "planes"
    raw_seconds: float        # projected s/token of each, streaming the whole trunk
    planes_seconds: float
    why: str                  # one line with the rates it came from


def choose_codec(disk: float, cores: int, decode_per_core: float, compute_per_core: float) -> CodecChoice:
    """The trunk codec a machine streams the full model faster with: `planes` only where restoring its
    bytes costs less time than the disk saves (few cores and a fast disk keep `raw`)."""
    raw = projection(1.0, decode_per_core, compute_per_core, 1.0, cores, disk)["seconds_per_token"]
    planes = projection(PLANES_RATIO, decode_per_core, compute_per_core, 1.0, cores, disk)["seconds_per_token"]
    codec = "planes" if planes < raw else "raw"
    why = (f"disk {disk / 1e9:.2f} GB/s, {cores} cores restoring {decode_per_core / 1e9:.2f} GB/s each and computing "
           f"{compute_per_core / 1e9:.1f} GB/s each: streaming the released Kimi K3's whole trunk projects {raw:.1f} s/token raw, "
           f"{planes:.1f} s/token planes")
    return CodecChoice(codec, raw, planes, why)


def ram_row(ram: float, machine: Machine, drafts: dict[str, list[Drafts]], unions=K3_UNION) -> dict:
    """One RAM size: serial s/token with a raw trunk, with the lossless one (its pinned layers restored or held
    coded, whichever is faster), and speculative with each group of `drafts` (the fastest layout and K)."""
    raw = layout_for(ram, 1.0)
    lossless = [layout_for(ram, PLANES_RATIO), layout_for(ram, PLANES_RATIO, coded=True)]
    return {"ram": ram, "raw": per_token(raw, machine, unions=unions),
            "lossless": fastest(lossless, machine, unions=unions),
            "speculation": {group: fastest([raw, *lossless], machine, d, unions) for group, d in drafts.items()}}


# `self` drafts on the real model (issue 40): the draft trunks `k3 pack --draft` derives from its tensor table
# (docs/DRAFT-TRUNK.md, held in RAM beside the model), the C engine's real-model acceptance (its notes: 94.2 % of
# teacher-forced positions agree for its int8 derivation; 66.7 % of drafts accepted in a first live run), and the
# draft's routed experts per token (half the model's 16: --draft-topk's default)
K3_DRAFT_BYTES = {"int8": 55.64e9, "int4": 34.77e9}
C_ENGINE_ACCEPTANCE = {"live": 0.667, "teacher-forced": 0.942}
DRAFT_TOPK = 8
MIN_TARGET_RAM = 8e9  # what the model itself needs beside a draft: the laptop preset's 8 GB
SELF_KS = (1, 2, 4, 8)


def draft_pass(machine: Machine, kind: str, k: int, unions=K3_UNION) -> dict:
    """Proposing k ids with a `kind` draft: k forwards of one id each, every one through the whole draft trunk (held)
    and DRAFT_TOPK experts a MoE layer, read from disk as the model's are (no cache hits: the same rule as pass_cost);
    the k ids' experts are the union of k consecutive tokens' (the model's routing, at half its experts)."""
    share = DRAFT_TOPK / (K3_EXPERTS_PER_TOKEN / 92)
    read = TOKEN_EXPERT_BYTES * share * union_ratio(k, unions)
    cpu = k * (K3_DRAFT_BYTES[kind] + TOKEN_EXPERT_BYTES * share) / machine.compute_per_core / machine.cores
    return {"bytes_read": read, "disk_seconds": read / machine.disk, "cpu_seconds": cpu,
            "seconds": max(read / machine.disk, cpu) * machine.overhead}


def self_row(ram: float, machine: Machine, kind: str, acceptance: float, unions=K3_UNION) -> dict | None:
    """`self` drafts at `ram` bytes: the draft trunk held, the model laid out in what is left (the fastest of its raw
    and lossless layouts), each drafted id accepted with probability `acceptance` until the first miss (a pass of K
    drafts yields 1 + p + … + p^K ids), a token costing (draft + verify) ÷ that; the fastest K of SELF_KS. None when
    the draft leaves the model less than MIN_TARGET_RAM."""
    left = ram - K3_DRAFT_BYTES[kind]
    if left < MIN_TARGET_RAM:
        return None
    best = None
    for layout in (layout_for(left, 1.0), layout_for(left, PLANES_RATIO), layout_for(left, PLANES_RATIO, coded=True)):
        for k in SELF_KS:
            tokens = sum(acceptance ** j for j in range(k + 1))
            verify, draft = pass_cost(layout, machine, 1 + k, unions), draft_pass(machine, kind, k, unions)
            seconds = (verify["seconds"] + draft["seconds"]) / tokens
            if best is None or seconds < best["seconds_per_token"]:
                best = {"layout": layout.name, "k": k, "tokens_per_pass": tokens, "verify_seconds": verify["seconds"],
                        "draft_seconds": draft["seconds"], "bytes_per_token": (verify["bytes_read"]
                                                                               + draft["bytes_read"]) / tokens,
                        "seconds_per_token": seconds}
    return best


def choose_trunk_codec(disk_bytes_per_second: float, cores: int | None = None, seconds: float = 0.3) -> CodecChoice:
    """The trunk codec (`k3 pack --codec`) this machine streams the full model faster with, from the disk rate
    given (`k3 doctor`'s disk read) and the restore and bf16 kernel rates measured here on every core at once,
    as a token uses them (memory bandwidth is shared), for about `seconds` apiece (choose_codec: a projection,
    printed with its rates by `k3 setup`)."""
    import os

    from .rates import bf16_gemv_sweep, gaussian_restore_rate, timed

    cores = cores or len(os.sched_getaffinity(0))
    sweep, nbytes = bf16_gemv_sweep(cores)
    compute = nbytes / timed(sweep, seconds)["median_s"] / cores
    return choose_codec(disk_bytes_per_second, cores, gaussian_restore_rate(seconds, threads=cores) / cores, compute)
