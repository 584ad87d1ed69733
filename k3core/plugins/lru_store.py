"""The `lru` expert store: an arena of expert slots sized by the cache budget, least recently used out.
It is plugin_api's CachingStore kept by LRUPolicy, the same policy object `k3 sim-cache` replays."""
from __future__ import annotations

from ..plugin_api import CachingStore, LRUPolicy, hookimpl


class LRUStore(CachingStore):
    name = "lru"
    description = "keep recently used experts in a slot arena of --cache-gb; least recently used out"

    @classmethod
    def policy(cls, slots, options):
        return LRUPolicy(slots)


@hookimpl(trylast=True)
def k3_expert_stores():
    return [LRUStore]
