"""What a token of the full Kimi K3 costs on a given machine, from measured rates: the bytes it reads and
the CPU it spends, by trunk codec. `k3 bench stream` projects from the rates of its own run; `k3 setup`
picks the codec its machine runs faster (choose_codec).

The method (docs/PERFORMANCE.md, "the real model at 8 GB, projected"):

* bytes read per token: the whole trunk and lm_head (the 8 GB laptop preset's 3 GB of trunk holds the
  two-slot ring, ~2.3 GB, and no layer) at the codec's stored ratio, plus the experts an LRU of 1 GB
  misses on the real routing trace;
* CPU per token: restoring the trunk at the decode rate per core, plus the kernels over every weight byte
  the token touches at the kernel rate per core, spread over all cores;
* s/token = max(disk time, CPU time) × an overhead: what a streamed pipeline loses to imperfect overlap
  (a floor run's s/token ÷ its disk floor; at least 1).
"""
from __future__ import annotations

from dataclasses import dataclass

K3_TRUNK_BYTES = 108.81e9
K3_HEAD_BYTES = 2.35e9
K3_EXPERTS_PER_TOKEN = 16 * 92
K3_EXPERT_BYTES = 17_547_264
K3_LRU_1GB_HIT_RATE = 0.3533  # TRUE hits of a 56-slot LRU on the real routing trace (docs/EXPERT-CACHE.md)
PLANES_RATIO = 0.6726         # `k3 pack --codec planes` on `k3 make-model --shape wide` (the real trunk's is
                              # not measurable here; its BF16 weights are the same kind of bytes)


def projection(ratio: float, decode_per_core: float, compute_per_core: float, overhead: float, cores: int,
               disk: float = 7e9) -> dict:
    """Full K3 at 8 GB of RAM with `cores` cores and a disk of `disk` bytes/s, for a trunk stored at `ratio`
    of its bytes (1: raw), restored at `decode_per_core` and computed at `compute_per_core` bytes/s per core."""
    stream = K3_TRUNK_BYTES + K3_HEAD_BYTES
    experts = K3_EXPERTS_PER_TOKEN * K3_EXPERT_BYTES * (1 - K3_LRU_1GB_HIT_RATE)
    read = stream * ratio + experts
    touched = stream + K3_EXPERTS_PER_TOKEN * K3_EXPERT_BYTES
    cpu = ((stream / decode_per_core if ratio < 1 else 0.0) + touched / compute_per_core) / cores
    return {"cores": cores, "disk_bytes_per_second": disk, "bytes_read_per_token": read,
            "disk_seconds": read / disk, "cpu_seconds": cpu, "overhead": overhead,
            "seconds_per_token": max(read / disk, cpu) * overhead}


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
           f"{compute_per_core / 1e9:.1f} GB/s each: streaming the whole trunk projects {raw:.1f} s/token raw, "
           f"{planes:.1f} s/token planes")
    return CodecChoice(codec, raw, planes, why)
