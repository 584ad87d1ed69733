"""Reading every tensor of a checkpoint once: the checksums every later read is checked against, and the
values worth a warning (non-finite floats, E8M0 scale bytes of 255). `k3 setup`'s verify step runs both."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from . import tensor_sums
from .checkpoint import open_checkpoint
from .safetensors_index import ShardIndex


def record_tensor_sums(model_dir, progress=None, jobs: int = 4, known: dict | None = None) -> Path:
    """Read every tensor of the checkpoint in `model_dir` and record its checksum in k3-tensor-sums.bin there:
    what every later read from the checkpoint (experts, a resident trunk) is checked against. `progress(done_bytes,
    total_bytes)` as it reads; `jobs` shards at a time; `known`: {shard path: ShardSums} a hash pass already fed
    (those shards are not read again). Returns the file's path. It trusts the bytes on disk and replaces any record:
    `k3 verify` first compares them with the record (tensor_sums.compare) and records over none that differ."""
    return tensor_sums.record(ShardIndex.open(model_dir), progress, jobs, known)


def scan_weights(model_dir, progress=None) -> dict:
    """Read every tensor of a checkpoint: {"non_finite": [(tensor, count)], "scale_255": [(tensor, count)]} —
    BF16/F16/F32 values that are NaN or infinite (a damaged checkpoint), and E8M0 scale bytes of 255 (legal:
    MODEL.md §5 reads such a group as zeros; worth knowing). `progress(done_bytes, total_bytes, name)` if given."""
    checkpoint = open_checkpoint(model_dir)
    index, out = checkpoint.index, {"non_finite": [], "scale_255": []}
    try:
        names = list(index.names())
        total, done = sum(index[n].nbytes for n in names), 0
        for name in names:
            info, data = index[name], index.read(name)
            if info.dtype in ("BF16", "F16"):
                bad = int(np.count_nonzero((data.view(np.uint16) & (0x7F80 if info.dtype == "BF16" else 0x7C00))
                                           == (0x7F80 if info.dtype == "BF16" else 0x7C00)))
            elif info.dtype in ("F32", "F64"):
                bad = int(np.count_nonzero(~np.isfinite(data)))
            else:
                bad = 0
            if bad:
                out["non_finite"].append((name, bad))
            if info.dtype == "U8" and name.endswith(".weight_scale") and (n255 := int(np.count_nonzero(data == 255))):
                out["scale_255"].append((name, n255))
            done += info.nbytes
            if progress:
                progress(done, total, name)
    finally:
        checkpoint.close()
    return out
