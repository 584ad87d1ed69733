"""Everything a k3 plugin may use, in one module (docs/plugins/ is the contract in words). k3's own
built-in plugins (k3core/plugins/) import from here and nowhere else, so this surface is exercised on
every run; a third-party package does the same:

    from k3core.plugin_api import ExpertStore, PluginOptions, hookimpl, ExpertReader, ...

What is here, by use:
- registering: `hookimpl` (the hooks are in k3core.hookspecs; see docs/plugins/hooks.md);
- the interfaces: KernelBackend, AttentionBackend, ExpertStore, TrunkPlacer, CachePolicy (and
  LRUPolicy, the reference rule), DraftSource (and DraftTarget, what the engine offers one), with the
  types they pass: Param, Weights, ExpertWeights, TensorSpec, and DTYPES (safetensors dtype → itemsize, numpy dtype);
- what a placer or store receives: PluginContext (checkpoint, Budget, its own PluginOptions) and
  returns from plan(): PlanRow;
- a ready expert store to subclass: CachingStore (a slot arena kept by the CachePolicy you give it);
- reading bytes: ExpertReader + expert_slot_bytes for experts; the aligned reader (ALIGN, aligned_buffer
  (huge=True for a buffer reads land in again and again), Prefault, open_for_reading, read_into, read_exact;
  Span + read_spans for many spans in parallel) for anything else; open_trunk / load_trunk for a packed
  trunk, TrunkReader for its restored bytes whatever its codec (RAW, or a coded pack: trunk_scratch_bytes for
  the plan; a buffer for n restored bytes: trunk_room_for, and what a buffer holds: trunk_capacity);
- naming tensors: PREFIX, HEAD, VISION_PREFIXES, layer_prefix, expert_prefix, EXPERT_PARTS, MATRIX, FLOAT;
- the counters the run report reads: STORE_STATS, PLACER_STATS;
- errors: UnsoundRunError (a read failed: exit 4), PlanError, UsageError, PluginError, CheckpointError;
- small helpers: read_limited (a file read whole within a byte limit that is named when it is passed),
  human (bytes for people), default_threads, KERNEL_FAMILIES (the families set_family_threads caps),
  builtin_kernels (k3's own kernel backends, to wrap), the native kernels module `native`, and the MXFP4 tables
  E2M1 / scale_multipliers.
"""
from __future__ import annotations

from . import _native as native
from .errors import CheckpointError, PlanError, PluginError, UnsoundRunError, UsageError
from .hookspecs import hookimpl
from .interfaces import (AttentionBackend, Budget, CachePolicy, DraftSource, DraftTarget, ExpertStore, ExpertWeights,
                         KERNEL_FAMILIES, KernelBackend, LRUPolicy, Param, PlanRow, PluginContext, PluginOptions,
                         TensorSpec, TrunkPlacer, Weights, default_threads)
from .files.aligned_io import (ALIGN, Opened, Prefault, Span, align_down, align_up, aligned_buffer, open_for_reading,
                            read_exact, read_into, read_spans)
from .io.caching_store import CachingOptions, CachingStore, cache_slots, nan_scales
from .io.expert_io import ExpertReader, expert_slot_bytes
from .format.safetensors_index import DTYPES
from .io.codec import RAW
from .format.tensor_sums import TensorSums
from .io.trunk import load_trunk, open_trunk
from .io.trunk_reader import TrunkReader, capacity as trunk_capacity, room_for as trunk_room_for, \
    scratch_bytes as trunk_scratch_bytes
from .units import human
from .files.limits import read_limited
from .format.checkpoint import (EXPERT_PARTS, FLOAT, HEAD, MATRIX, PREFIX, VISION_PREFIXES, expert_prefix,
                               layer_prefix)
from .format.mxfp4 import E2M1, scale_multipliers

# The counters an expert store's stats() reports (the run report and `k3 bench` read them; a store may
# add its own keys). Every one is required of a store, and checked by k3core.testing.
STORE_STATS = {
    "expert_requests": "experts asked for: each id of each fetch (int)",
    "expert_hits": "of those, experts resident before they were asked for: TRUE hits (int)",
    "expert_evictions": "experts dropped to make room (int; 0 for a store that keeps nothing)",
    "expert_bytes_read": "bytes read from the shards (int)",
    "expert_read_seconds": "wall time with at least one of those reads in flight (float)",
    "expert_slots": "experts the store's buffers hold at once (int; what cache_policy(slots) is given)",
    "expert_slot_bytes": "bytes one expert occupies in the store's buffers, alignment included (int)",
}
# Read when present: a store that prefetches counts these too.
STORE_PREFETCH_STATS = {
    "expert_wait_seconds": "wall time fetch() blocked the forward pass (float; without prefetch ~ expert_read_seconds)",
    "expert_prefetched": "experts read on the engine's guess before they were asked for (int)",
    "expert_prefetch_used": "of those, experts a fetch then asked for and was served from the staged read (int)",
}
# The counters a trunk placer's stats() reports; `trunk_bytes_read` is required, the others are read
# when present (a placer that never waits reports none).
PLACER_STATS = {
    "trunk_bytes_read": "bytes of trunk read from disk since open, pinned loads included (int)",
    "trunk_read_seconds": "time the reads took (float)",
    "trunk_wait_seconds": "time the forward pass waited for a layer to arrive (float)",
    "trunk_decode_seconds": "time spent restoring a coded pack's blocks (float; 0 for a raw pack)",
}

def builtin_kernels(name: str | None = None) -> KernelBackend:
    """k3's own kernel backend `name` (avx512, avx2, neon, scalar, reference), or the best native one this
    CPU runs: what a plugin wrapping the built-in kernels wraps, whichever backend is the default."""
    from .plugin_manager import get_plugin_manager, offered, origin

    pm = get_plugin_manager()
    for o in offered(pm, "k3_kernel_backends"):
        wanted = o.name == name if name is not None else o.item.bit_exact
        if origin(pm, o.plugin) == "built-in" and o.item.available() and wanted:
            return o.item
    raise PluginError(f"no built-in kernel backend {name!r} is available on this machine" if name else
                      "no built-in native kernel backend is available on this machine")


__all__ = [
    # registering a plugin (the hooks are in k3core.hookspecs)
    "hookimpl",
    # the kinds of plugin: the interfaces one implements
    "KernelBackend", "AttentionBackend", "ExpertStore", "TrunkPlacer", "CachePolicy", "LRUPolicy", "DraftSource",
    "DraftTarget",
    # the types the interfaces pass
    "Param", "Weights", "ExpertWeights", "TensorSpec", "DTYPES",
    # what a placer or store is given, and what its plan() returns
    "PluginContext", "Budget", "PluginOptions", "PlanRow",
    # an expert store to subclass
    "CachingStore", "CachingOptions", "cache_slots", "nan_scales",
    # reading bytes: experts; anything else, through the aligned reader; a packed trunk; checkpoint tensors, checked
    "ExpertReader", "expert_slot_bytes",
    "ALIGN", "Opened", "align_down", "align_up", "aligned_buffer", "Prefault", "open_for_reading", "read_into",
    "read_exact", "Span", "read_spans",
    "open_trunk", "load_trunk", "TrunkReader", "trunk_scratch_bytes", "trunk_room_for", "trunk_capacity", "RAW",
    "TensorSums",
    # naming tensors
    "PREFIX", "HEAD", "VISION_PREFIXES", "layer_prefix", "expert_prefix", "EXPERT_PARTS", "MATRIX", "FLOAT",
    # the counters a store's and a placer's stats() report
    "STORE_STATS", "STORE_PREFETCH_STATS", "PLACER_STATS",
    # errors
    "UnsoundRunError", "PlanError", "UsageError", "PluginError", "CheckpointError",
    # small helpers
    "human", "read_limited", "default_threads", "KERNEL_FAMILIES", "native", "builtin_kernels", "E2M1",
    "scale_multipliers",
]
