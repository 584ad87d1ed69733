"""The `direct` expert store: read the selected experts from disk on every use; keep nothing.

A fetch reads all asked experts concurrently into reusable page-aligned scratch slots, O_DIRECT
where the filesystem allows. Every request is a miss by design: its TRUE hit rate is 0.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..plugin_api import (ExpertReader, ExpertStore, PlanRow, PluginOptions, Prefault, aligned_buffer,
                          expert_slot_bytes, hookimpl, human, nan_scales)


@dataclass(frozen=True)
class DirectOptions(PluginOptions):
    direct_io: bool = True  # O_DIRECT reads where the filesystem allows them
    check_reads: bool = True  # each expert read against its recorded checksums; false only to measure their cost
    read_threads: int = 16  # expert reads in flight at once (`k3 tune` measures what this disk likes)
    read_kib: int = 0  # an expert's bytes read in pieces of at most this many KiB (a multiple of 4); 0: whole


class DirectStore(ExpertStore):
    name = "direct"
    description = "read the selected experts from disk on every use; no cache"
    Options = DirectOptions

    def __init__(self, ctx):
        super().__init__(ctx)
        self.reader = ExpertReader(self.checkpoint, self.options.direct_io, self.options.check_reads,
                                   self.options.read_threads, self.options.read_kib)
        self.slot_bytes = expert_slot_bytes(self.checkpoint)
        self.slots = self.config.num_experts_per_token
        self._arena = aligned_buffer(self.slots * self.slot_bytes, huge=True)
        self._prefault = Prefault(self._arena)
        self.requests = 0

    @classmethod
    def plan(cls, ctx):
        slot = expert_slot_bytes(ctx.checkpoint)
        k = ctx.config.num_experts_per_token
        return [PlanRow("expert scratch", k * slot, f"{k} slots × {human(slot)} (no cache)")]

    def capacity(self) -> int:
        return self.slots

    def fetch(self, layer, experts):
        if len(experts) > self.slots:
            raise ValueError(f"direct store holds {self.slots} experts per fetch, asked for {len(experts)}")
        view = memoryview(self._arena)
        requests = [(layer, e, view[i * self.slot_bytes:(i + 1) * self.slot_bytes]) for i, e in enumerate(experts)]
        self.requests += len(experts)
        return self.reader.read(requests)

    def stats(self):
        return {"expert_requests": self.requests, "expert_hits": 0, "expert_evictions": 0,
                "expert_bytes_read": self.reader.bytes_read, "expert_read_seconds": self.reader.seconds,
                "expert_read_mode": self.reader.mode, "expert_slots": self.slots, "expert_slot_bytes": self.slot_bytes,
                "expert_reads_checked": self.options.check_reads, "expert_nan_scales": nan_scales(self.reader)}

    def close(self):
        self._prefault.stop()
        self.reader.close()


@hookimpl(trylast=True)
def k3_expert_stores():
    return [DirectStore]
