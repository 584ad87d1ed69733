"""What the disk gives k3's reads, probed on a checkpoint's own files: O_DIRECT reads of whole expert runs,
as the expert store issues them, alone or while every core computes as a token's kernels do."""
from __future__ import annotations

import threading

from ..files.aligned_io import align_down, align_up, read_rate
from ..format.checkpoint import EXPERT_PARTS, expert_prefix, open_checkpoint
from ..interfaces import default_threads
from .rates import bf16_gemv_sweep


def raw_probe(model_dir, seconds: float = 3.0, depth: int = 16, huge: bool = True) -> dict:
    """O_DIRECT reads of whole expert runs of this checkpoint, `depth` at a time, into huge-page buffers like
    the engine's expert slots (`huge=False`: 4 KB pages): what the disk gives."""
    ckpt = open_checkpoint(model_dir)
    c = ckpt.config
    spans = []
    for layer in range(c.first_k_dense_replace, c.num_hidden_layers):
        for e in range(c.num_experts):
            first = ckpt.index[expert_prefix(layer, e) + EXPERT_PARTS[0]]
            last = ckpt.index[expert_prefix(layer, e) + EXPERT_PARTS[-1]]
            start = align_down(first.offset)
            spans.append((str(first.file), start, align_up(last.offset + last.nbytes - start)))
    ckpt.close()
    return read_rate(spans, seconds, depth, huge)



def busy_probe(model_dir, seconds: float = 3.0, depth: int = 16) -> dict:
    """raw_probe while every core runs bf16 GEMVs over 128 MB of weights, as a token's kernels keep them
    busy: what the disk gives expert reads that overlap compute (on a VM a read's completion can wait
    for a busy virtual CPU)."""
    sweep, _ = bf16_gemv_sweep(default_threads())
    stop = threading.Event()

    def compute():
        while not stop.is_set():
            sweep()

    worker = threading.Thread(target=compute, name="k3-busy-probe")
    worker.start()
    try:
        return raw_probe(model_dir, seconds, depth)
    finally:
        stop.set()
        worker.join()
