"""What a prompt costs to forward, and the prefill chunk that forwards it fastest (issue 39; docs/PERFORMANCE.md,
"The prompt side"; the method in full: docs/performance-notes/prefill-issue-39.md).

A pass of T prompt ids whose first sits at position p costs
    read(T)    = the trunk bytes the placer streams + moe_layers × union(T) × expert_bytes × miss
    compute(T) = (T × macs_per_id / macs_per_core + (T·p + T(T+1)/2) × macs_per_pair / attention_rate) / cores
    exposed(T) = moe_layers × max(0, first(T) − top_k) × expert_bytes × miss
    seconds(T) = max(read(T) / disk, compute(T)) + exposed(T) / disk
— reads run behind compute: the ring reads the next trunk layer while one computes, and an expert cache smaller
than a layer's union serves it in rounds of half its slots, the next round read while this one computes
(CachingStore.fetch_batches). What no compute hides is each MoE layer's first round, first(T) = union(T) when it
fits the cache's slots, else half of them, less the top_k experts read on the router's guess while attention ran.
`miss` is 0 when the expert cache holds every expert, else 1 (where_held says why). union(T), the distinct experts
T consecutive ids route to in one MoE layer, is the real model's (K3_UNION, from its routing trace) up to T = 12;
beyond, the power law fitted to T = 2..12, never more than every expert. macs_per_pair is latent-space MLA
attention (an id against each earlier position: heads × (2·kv_lora_rank + qk_rope_head_dim) per MLA layer), at
its own rate (ATTENTION_RATIO of the pass's unless measured); KDA layers cost the same at every position and are in
macs_per_id.

A chunk reads the trunk and its experts' union once however long it is, so longer chunks amortise the reads
until compute binds; "auto" takes the shortest chunk, a multiple of CHUNK_STEP from DEFAULT_CHUNK up, whose
seconds per prompt id are within SLACK of the best the memory allows (its activations at most CHUNK_SHARE of
the RAM available and within what the rest of the plan leaves). Never below DEFAULT_CHUNK: below it the
per-pass costs this model does not count (Python between kernels, dispatch of experts with few ids) grow.
The ids never depend on the chunk.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

DEFAULT_CHUNK, CHUNK_STEP = 512, 256
CHUNK_SHARE = 1 / 16      # of the RAM available, at most, for one pass's activations
SLACK = 0.02              # seconds per prompt id within 2 % of the best are as good
# item T - 1: distinct experts of T consecutive ids per MoE layer ÷ top-k, on the real model's routing trace
# (tests/fixtures/k3-in-c/expert_trace.bin, machine/routing.py; tests/machine/test_cost.py recomputes it)
K3_UNION = (1.0, 1.657, 2.228, 2.756, 3.253, 3.746, 4.252, 4.718, 5.181, 5.666, 6.186, 6.8)
# what `auto` assumes of a machine it has not measured: an NVMe that reads 3 GB/s, and the multiply-adds per
# second per core prefill reached end to end on `wide` (issue 39: 27 G on a Zen 4 core); `k3 bench project`
# takes both as flags
ASSUMED_DISK = 3e9
ASSUMED_MACS_PER_CORE = 27e9
# MLA attention's multiply-adds per second per core ÷ the products' at T = 64, both in one run (`k3 bench kernels
# --backends avx512 --threads 1,2` on an Ice Lake core: 14 % of the FMA probe against bf16's 40 % on two threads,
# 23 % against 45 % on one): attention reads every cached latent once per query and head block, so it runs slower
ATTENTION_RATIO = 0.35


@dataclass(frozen=True)
class Shape:
    """What a pass of one model touches: bytes and multiply-adds."""
    trunk_bytes: float        # weights besides the routed experts, the embedding and the vision tower
    expert_bytes: float       # one routed expert, as stored
    moe_layers: int
    experts: int              # routed experts per MoE layer
    top_k: int
    macs_per_id: float        # weight multiply-adds of one id (trunk matrices + top-k experts per MoE layer)
    macs_per_pair: float      # attention multiply-adds of one id against one earlier position
    activation_bytes: float   # one id's share of a pass's largest per-layer activations (plan/budget.py)

    @classmethod
    def of_checkpoint(cls, checkpoint) -> "Shape":
        """A checkpoint's shape, its byte counts from its headers (format/checkpoint.py)."""
        from ..format.checkpoint import expert_bytes, trunk_bytes_per_pass

        return cls.of(checkpoint.config, trunk_bytes_per_pass(checkpoint), expert_bytes(checkpoint))

    @classmethod
    def of(cls, config, trunk_bytes: float, expert_bytes: float) -> "Shape":
        """From a model's config and its byte counts (trunk weights are bf16: a multiply-add per 2 bytes)."""
        from .budget import prefill_bytes

        c = config
        moe = c.num_hidden_layers - min(c.first_k_dense_replace, c.num_hidden_layers)
        expert_macs = 3 * c.moe_intermediate_size * c.routed_expert_hidden_size
        mla = sum(c.attention_kind(L) == "mla" for L in range(c.num_hidden_layers))
        pair = mla * c.num_attention_heads * (2 * c.kv_lora_rank + c.qk_rope_head_dim)
        return cls(trunk_bytes, expert_bytes, moe, c.num_experts, c.num_experts_per_token,
                   trunk_bytes / 2 + moe * c.num_experts_per_token * expert_macs, pair, prefill_bytes(c, 1))


# Kimi K3 (SPEC.md): trunk 108.81 GB + lm_head 2.35 GB bf16; 92 MoE layers of 896 experts, top 16, each expert
# 3 × 3072 × 3584 weights in 17,547,264 MXFP4 bytes; 24 MLA layers of 96 heads, kv_lora_rank 512, rope 64; a pass
# row's activations: a MoE layer's 896 router logits + 3584 × 17 latent floats + 6 × 7168, float32
K3 = Shape(trunk_bytes=108.81e9 + 2.35e9, expert_bytes=17_547_264, moe_layers=92, experts=896, top_k=16,
           macs_per_id=(108.81e9 + 2.35e9) / 2 + 92 * 16 * 3 * 3072 * 3584,
           macs_per_pair=24 * 96 * (2 * 512 + 64), activation_bytes=4 * (896 + 3584 * 17 + 6 * 7168))


@dataclass(frozen=True)
class Where:
    """What of a pass is read from disk."""
    trunk_streamed: float     # trunk bytes read per pass (as stored)
    expert_miss: float = 1.0  # share of routed experts read (1: none cached)
    slots: float = math.inf   # experts the cache holds at once (its rounds are half of them)


def where_held(shape: Shape, trunk_streamed: float, experts_held: float) -> Where:
    """What a plan whose placer reads `trunk_streamed` trunk bytes per pass (TrunkPlacer.streamed_bytes) and whose
    store holds `experts_held` bytes of experts leaves a pass to read. An expert cache that cannot hold every
    expert keeps none for the next pass: a pass visits the layers in order, so the least recently used expert is
    always the next layer's (`k3 bench prefill` on `wide`, a 1 GB cache and 1.68 GB of experts: every pass read
    all of them)."""
    every = shape.moe_layers * shape.experts * shape.expert_bytes
    slots = max(shape.top_k, experts_held // shape.expert_bytes - shape.top_k)  # less the prefetch's staging slots
    return Where(trunk_streamed, 0.0 if experts_held >= every else 1.0, slots)


@dataclass(frozen=True)
class Rates:
    disk: float               # bytes/s
    cores: int
    macs_per_core: float      # multiply-adds/s of a pass: the weights' products and the rest of the pass
    attention_macs_per_core: float = 0.0  # MLA attention's (macs_per_pair); 0: ATTENTION_RATIO x macs_per_core

    @property
    def attention_rate(self) -> float:
        return self.attention_macs_per_core or ATTENTION_RATIO * self.macs_per_core


def union_ratio(rows: float, unions=K3_UNION) -> float:
    """Distinct experts of `rows` consecutive ids in one MoE layer ÷ one id's: `unions` between whole T
    linearly, past its end the power law fitted to it (see the module's docstring)."""
    if rows > len(unions):
        return unions[-1] * (rows / len(unions)) ** _exponent(unions)
    whole = min(max(1, int(rows)), len(unions) - 1)
    return unions[whole - 1] + (rows - whole) * (unions[whole] - unions[whole - 1])


def union(rows: float, experts: int, top_k: int, unions=K3_UNION) -> float:
    """Distinct experts `rows` consecutive ids route to in one MoE layer: never more than every expert."""
    return min(experts, top_k * union_ratio(rows, unions))


def _exponent(unions) -> float:
    """The power law's exponent: least squares of log ratio on log T over T = 2..len(unions)."""
    xs = [math.log(t) for t in range(2, len(unions) + 1)]
    ys = [math.log(r) for r in unions[1:]]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def pass_seconds(shape: Shape, where: Where, rates: Rates, rows: int, start: int = 0) -> dict:
    """One pass of `rows` prompt ids, the first at position `start`: bytes read, disk and CPU seconds, the read
    seconds no compute hides, and the pass's seconds."""
    distinct = union(rows, shape.experts, shape.top_k)
    per_layer = shape.moe_layers * shape.expert_bytes * where.expert_miss
    read = where.trunk_streamed + distinct * per_layer
    first = distinct if distinct <= where.slots else where.slots // 2
    pairs = (rows * start + rows * (rows + 1) / 2) * shape.macs_per_pair
    cpu = (rows * shape.macs_per_id / rates.macs_per_core + pairs / rates.attention_rate) / rates.cores
    disk = read / rates.disk
    exposed = max(0.0, first - shape.top_k) * per_layer / rates.disk
    return {"rows": rows, "bytes_read": read, "disk_seconds": disk, "cpu_seconds": cpu, "exposed_seconds": exposed,
            "seconds": max(disk, cpu) + exposed}


def prompt_seconds(shape: Shape, where: Where, rates: Rates, chunk: int, prompt: int, cached: int = 0) -> float:
    """Seconds to forward ids cached..prompt in passes of `chunk`: the time to the first token of a prompt of
    `prompt` ids whose first `cached` ids a prompt cache holds."""
    total, at = 0.0, cached
    while at < prompt:
        rows = min(chunk, prompt - at)
        total += pass_seconds(shape, where, rates, rows, at)["seconds"]
        at += rows
    return total


def per_id(shape: Shape, where: Where, rates: Rates, chunk: int) -> float:
    """Seconds per prompt id of passes of `chunk`, attention left out: over a whole prompt its pairs are the same
    at every chunk length (each id meets each earlier position once), so it never favours one."""
    return pass_seconds(replace(shape, macs_per_pair=0.0), where, rates, chunk)["seconds"] / chunk


@dataclass(frozen=True)
class ChunkChoice:
    chunk: int
    seconds_per_id: float     # at `chunk`
    default_seconds_per_id: float  # at DEFAULT_CHUNK
    most: int                 # the longest chunk the memory allowed

    @property
    def why(self) -> str:
        if self.chunk == DEFAULT_CHUNK:
            return f"auto: longer chunks project no faster here (memory allows {self.most})"
        return (f"auto: {self.seconds_per_id:.3g} s per prompt id projected, {self.default_seconds_per_id:.3g} at "
                f"{DEFAULT_CHUNK} ({self.default_seconds_per_id / self.seconds_per_id:.2f}x); memory allows {self.most}")


def choose_chunk(shape: Shape, where: Where, rates: Rates, most: int) -> ChunkChoice:
    """The shortest chunk (DEFAULT_CHUNK, then multiples of CHUNK_STEP up to `most`) within SLACK of the best."""
    most = max(DEFAULT_CHUNK, most)
    lengths = [DEFAULT_CHUNK, *range(DEFAULT_CHUNK + CHUNK_STEP, most + 1, CHUNK_STEP)]
    costs = {n: per_id(shape, where, rates, n) for n in lengths}
    best = min(costs.values())
    chunk = next(n for n in lengths if costs[n] <= best * (1 + SLACK))
    return ChunkChoice(chunk, costs[chunk], costs[DEFAULT_CHUNK], most)


def most_rows(shape: Shape, ram: float, left: float | None = None) -> int:
    """The longest chunk whose activations take at most CHUNK_SHARE of `ram` and fit in `left` bytes."""
    room = ram * CHUNK_SHARE if left is None else min(ram * CHUNK_SHARE, left)
    return max(1, int(room // shape.activation_bytes))
