"""The `pinned` trunk placer: the layers that fit the trunk budget stay in RAM, the rest stream from the
packed trunk (k3 pack) through a ring of at least two slots, the next unit read in the background
while the current one computes. A slot is never refilled while its layer is handed out.

Units in visit order: the unpinned layers, then lm_head in row blocks unless it is pinned too. Every byte
comes through a TrunkReader, which restores a coded pack's blocks (k3 pack --codec) on the reading thread.

With a coded pack and `pin_coded`, pinned layers are held in RAM as their stored blocks (about 0.68× the
bytes, so more of them fit) and restored into a ring slot each time they are used, like a streamed layer
but without the read: every layer is then a unit of the ring.
"""
from __future__ import annotations

import mmap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..plugin_api import (DTYPES, HEAD, RAW, LRUPolicy, Param, PlanError, PlanRow, PluginOptions, Prefault, TrunkPlacer,
                          TrunkReader, UsageError, Weights, align_up, aligned_buffer, hookimpl, human, load_trunk,
                          open_trunk, trunk_capacity, trunk_room_for, trunk_scratch_bytes)

MIN_RING = 2
HEAD_BLOCK_BYTES = 64 << 20  # lm_head streams in row blocks of about this size when it is not pinned
LOAD_READERS = 4             # threads reading a raw pinned layer at load time, when no expert read waits
EMBED_ROWS_KEPT = 256        # embedding rows kept after their read (~3.7 MB on K3, within the working buffers): the
                             # ids a draft model just embedded are the next verify pass's


@dataclass(frozen=True)
class Layout:
    pinned: tuple[int, ...]   # layers kept in RAM
    head_pinned: bool
    ring_slots: int
    slot_bytes: int           # 0 when nothing streams
    pinned_bytes: int
    held: bool = False        # pinned layers are held as stored (coded) blocks, restored on each use


def _head_tensor(trunk):
    return next(t for t in trunk.model.tensors if t.name == HEAD)


@dataclass(frozen=True)
class PinnedOptions(PluginOptions):
    pin_head: bool | None = None  # keep lm_head in RAM; default: only when every layer is pinned
    pin_coded: bool = False  # with a coded pack, hold pinned layers as stored blocks and restore them on each
                             # use: more of them fit, but each costs a restore per token (measured slower than
                             # streaming them on 2 cores: docs/performance-notes/pin-coded.md)
    check_reads: bool = True  # every raw block read against the manifest's checksum; false only to measure the cost
                              # (a coded pack's blocks are always checked: restoring computes the checksum anyway)


def layout(trunk, config, budget, options: PinnedOptions) -> Layout:
    """Pin layers in visit order while pinned bytes + the ring fit the budget; then the head. With a coded
    pack, pinned layers are held coded when `pin_coded` says so."""
    if budget.ring_slots < MIN_RING:
        raise UsageError(f"the ring needs at least {MIN_RING} slots, got {budget.ring_slots}")
    return _layout(trunk, config, budget, options, held=trunk.codec != RAW and options.pin_coded)


def _layout(trunk, config, budget, options: PinnedOptions, held: bool) -> Layout:
    n, ring = config.num_hidden_layers, budget.ring_slots
    sizes = [TrunkReader.room(trunk.layer(L), 0, trunk.layer(L).length) for L in range(n)]  # a ring slot's need
    pinned_sizes = [trunk.layer(L).span if held else trunk.layer(L).padded for L in range(n)]  # kept in RAM
    head = _head_tensor(trunk)
    head_block = _head_room(trunk, head)
    if budget.pinned_layers is not None:
        k = max(0, min(n, budget.pinned_layers))
        head_pinned = k == n if options.pin_head is None else options.pin_head
    else:
        limit = budget.trunk_gb * 1e9 if budget.trunk_gb is not None else float("inf")

        def need(k, head_pinned):  # pinned bytes + the ring for whatever goes through it
            through = _through_ring(sizes, k, held) + ([] if head_pinned else [head_block])
            return sum(pinned_sizes[:k]) + (head.nbytes if head_pinned else 0) + (ring * max(through) if through else 0)

        fits = [(k, h) for k in range(n + 1) for h in ((False, True) if k == n else (False,)) if need(k, h) <= limit]
        k, head_pinned = max(fits, default=(0, False), key=lambda kh: (kh[0], kh[1]))
    through = _through_ring(sizes, k, held) + ([] if head_pinned else [head_block])
    slot = max(through) if through else 0
    pinned_bytes = sum(pinned_sizes[:k]) + (head.nbytes if head_pinned else 0)
    return Layout(tuple(range(k)), head_pinned, ring if through else 0, slot, pinned_bytes, held and k > 0)


def _head_room(trunk, head) -> int:
    """A ring slot's need for lm_head's row blocks: the whole head if it is one unit, else the worst block."""
    whole = TrunkReader.room(trunk.model, head.offset, head.offset + head.nbytes)
    return whole if head.nbytes <= HEAD_BLOCK_BYTES else \
        min(whole, trunk_room_for(trunk, max(HEAD_BLOCK_BYTES, head.shape[1] * 2)))


def _head_rows(trunk, head, slot_bytes: int) -> int:
    """Rows of lm_head per unit of the ring: all of them when the whole head fits a slot."""
    if TrunkReader.room(trunk.model, head.offset, head.offset + head.nbytes) <= slot_bytes:
        return head.shape[0]
    return max(1, trunk_capacity(trunk, slot_bytes) // (head.shape[1] * 2))


def _head_range(head, first: int, rows: int) -> tuple[int, int]:
    """lm_head's bytes [lo, hi) in the model run for its rows first .. first + rows (fewer at its end)."""
    row = head.shape[1] * 2
    return head.offset + first * row, head.offset + min(first + rows, head.shape[0]) * row


def _through_ring(sizes, pinned: int, held: bool) -> list[int]:
    """Restored sizes of the layers that pass through the ring: the streamed ones, and held ones too."""
    return sizes if held and pinned else sizes[pinned:]


def _give_back(buf, used: int) -> None:
    """A coded range's in-place room is larger than its bytes: the pages past `used` go back to the system."""
    if len(buf) > used:
        buf.madvise(mmap.MADV_DONTNEED, used, len(buf) - used)


class PinnedPlacer(TrunkPlacer):
    name = "pinned"
    description = "pin the layers that fit --trunk-gb; stream the rest from the packed trunk through a ring"
    Options = PinnedOptions

    @classmethod
    def plan(cls, ctx):
        budget, config = ctx.budget, ctx.config
        if budget.trunk_dir is None:
            raise UsageError("the pinned trunk placer streams from a packed trunk: give --trunk DIR (`k3 pack`)")
        trunk = load_trunk(budget.trunk_dir, ctx.checkpoint)  # another model's pack: said before its runs are used
        lay = layout(trunk, config, budget, ctx.options)
        if budget.trunk_gb is not None and lay.pinned_bytes + lay.ring_slots * lay.slot_bytes > budget.trunk_gb * 1e9:
            raise PlanError(f"--trunk-gb {budget.trunk_gb:g} cannot hold even the ring: {lay.ring_slots} slots × "
                            f"{human(lay.slot_bytes)}")
        head = "and lm_head " if lay.head_pinned else ""
        held = f", held as {trunk.codec} blocks and restored on each use" if lay.held else ""
        return [PlanRow("pinned trunk", lay.pinned_bytes, f"layers 0..{len(lay.pinned) - 1} {head}of "
                        f"{config.num_hidden_layers}{held}" if lay.pinned else f"no layers {head}pinned"),
                PlanRow("trunk ring", lay.ring_slots * lay.slot_bytes, f"{lay.ring_slots} slots × "
                        f"{human(lay.slot_bytes)}" + ("" if trunk.codec == RAW else " (a layer and the slack it is "
                                                     "restored in place with)") if lay.ring_slots else "nothing streams")] + (
            [] if trunk.codec == RAW else
            [PlanRow("trunk codec scratch", trunk_scratch_bytes(trunk), f"{trunk.codec} blocks a range cuts, "
                                                                            "small reads, exponent planes")])

    @classmethod
    def streamed_bytes(cls, ctx):
        """The stored bytes of every layer not pinned (a coded pack's held layers are restored, not read), and of
        lm_head unless pinned."""
        trunk = load_trunk(ctx.budget.trunk_dir, ctx.checkpoint)
        lay = layout(trunk, ctx.config, ctx.budget, ctx.options)
        layers = sum(trunk.layer(L).span for L in range(ctx.config.num_hidden_layers) if L not in lay.pinned)
        if lay.head_pinned:
            return layers
        head = _head_tensor(trunk)
        rows = _head_rows(trunk, head, lay.slot_bytes)
        return layers + sum(TrunkReader.disk_bytes(trunk.model, *_head_range(head, r, rows))
                            for r in range(0, head.shape[0], rows))

    def __init__(self, ctx):
        super().__init__(ctx)
        config = self.config
        self.trunk = open_trunk(ctx.budget.trunk_dir, self.checkpoint)
        self.layout = lay = layout(self.trunk, config, ctx.budget, self.options)
        self.reader = TrunkReader(self.trunk, self.options.check_reads)
        self.wait_seconds = 0.0
        self._pinned = {} if lay.held else self._load_pinned(lay.pinned)
        self._held = {L: self.reader.read_stored(self.trunk.layer(L)) for L in lay.pinned} if lay.held else {}
        model = self.trunk.model
        self._head = _head_tensor(self.trunk)
        small = [t for t in model.tensors if t.name != HEAD and not t.name.endswith("embed_tokens.weight")]
        self._model = Weights("", {t.name: self._read_tensor(model, t) for t in small})
        self._embed = next(t for t in model.tensors if t.name.endswith("embed_tokens.weight"))
        self._rows, self._kept_rows = {}, LRUPolicy(EMBED_ROWS_KEPT)  # id -> its embedding row (bf16 bits), as read
        self._head_param = self._load_head() if lay.head_pinned else None
        self._units = [("layer", L) for L in range(config.num_hidden_layers) if L not in self._pinned]
        if not lay.head_pinned:
            rows = _head_rows(self.trunk, self._head, lay.slot_bytes)
            self._units += [("head", r) for r in range(0, self._head.shape[0], rows)]
            self._head_rows = rows
        self._slots = [aligned_buffer(lay.slot_bytes, huge=True) for _ in range(lay.ring_slots)]
        self._prefaults = [Prefault(slot) for slot in self._slots]
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="k3-trunk-read")
        self._inflight: dict[tuple, tuple[int, object]] = {}  # unit -> (slot, future of the data's offset)
        self._current: tuple | None = None                    # the unit handed out, its slot and offset

    # ---- resident parts ---------------------------------------------------------------------------
    def _load_pinned(self, layers) -> dict[int, Weights]:
        """The pinned layers read into RAM one after another (a raw one by LOAD_READERS threads), every block
        checked against the manifest as it lands (TrunkReader)."""
        pinned = {}
        for L in layers:
            run = self.trunk.layer(L)
            buf = aligned_buffer(TrunkReader.room(run, 0, run.length))
            self.reader.read(run, 0, run.length, buf, workers=LOAD_READERS)  # runs start aligned: bytes at 0
            _give_back(buf, run.padded)
            pinned[L] = run.weights(buf)
        return pinned

    def _load_head(self) -> Param:
        run, t = self.trunk.model, self._head
        buf = aligned_buffer(TrunkReader.room(run, t.offset, t.offset + t.nbytes))
        at = self.reader.read(run, t.offset, t.offset + t.nbytes, buf, workers=LOAD_READERS)
        _give_back(buf, align_up(at + t.nbytes))
        return t.param(buf, at)

    def _read_tensor(self, run, t) -> Param:
        data = self.reader.read_bytes(run, t.offset, t.nbytes)
        return Param(np.frombuffer(data, DTYPES[t.dtype][1]).reshape(t.shape).copy(), t.dtype, t.name)

    # ---- the ring ---------------------------------------------------------------------------------
    def _range(self, unit):
        """The run a unit lives in and its restored bytes [lo, hi) there."""
        kind, i = unit
        if kind == "layer":
            run = self.trunk.layer(i)
            return run, 0, run.length
        return (self.trunk.model, *_head_range(self._head, i, self._head_rows))

    def _submit(self, unit, slot):
        kind, i = unit
        if kind == "layer" and i in self._held:  # restored from RAM, no read
            future = self._reader.submit(self.reader.restore_stored, self.trunk.layer(i), self._held[i], self._slots[slot])
        else:
            future = self._reader.submit(self.reader.read, *self._range(unit), self._slots[slot])
        self._inflight[unit] = (slot, future)

    def _acquire(self, unit) -> tuple[int, int]:
        """Wait until `unit` is in a slot and hand that slot out, with the offset of the unit's first byte
        there; the unit handed out before is done with, so its slot may be refilled; start reading the
        units that come next."""
        self._current = None
        if unit not in self._inflight:
            self._submit(unit, self._free_slot())
        slot, future = self._inflight.pop(unit)
        start = time.perf_counter()
        at = future.result()
        self.wait_seconds += time.perf_counter() - start
        self._current = (unit, slot, at)
        here = self._units.index(unit)
        for step in range(1, len(self._slots)):
            nxt = self._units[(here + step) % len(self._units)]
            if nxt == unit or nxt in self._inflight:
                continue
            if len(self._inflight) + 1 >= len(self._slots):
                break
            self._submit(nxt, self._free_slot())
        return slot, at

    def _free_slot(self) -> int:
        busy = {s for s, _ in self._inflight.values()} | ({self._current[1]} if self._current else set())
        for s in range(len(self._slots)):
            if s not in busy:
                return s
        _, (slot, future) = self._inflight.popitem()  # a read-ahead nobody asked for: let it land, reuse it
        future.result()
        return slot

    # ---- the placer interface ---------------------------------------------------------------------
    def layer(self, layer):
        if layer in self._pinned:
            return self._pinned[layer]
        slot, _ = self._acquire(("layer", layer))  # runs start aligned: their bytes are at 0
        return self.trunk.layer(layer).weights(self._slots[slot])

    def model(self):
        return self._model

    def embed_rows(self, ids):
        return Param(np.stack([self._embed_row(int(i)) for i in ids]), self._embed.dtype).f32()

    def _embed_row(self, i: int) -> np.ndarray:
        """Row i's bits: kept from an earlier read, else read (its blocks checked) and kept."""
        hit, evicted = self._kept_rows.access(i)
        if evicted is not None:
            del self._rows[evicted]
        if not hit:
            e, H = self._embed, self._embed.shape[1]
            self._rows[i] = np.frombuffer(self.reader.read_bytes(self.trunk.model, e.offset + i * H * 2, H * 2),
                                          np.uint16)
        return self._rows[i]

    def head_blocks(self):
        if self._head_param is not None:
            yield 0, self._head_param
            return
        H = self._head.shape[1]
        for r in range(0, self._head.shape[0], self._head_rows):
            slot, at = self._acquire(("head", r))
            rows = min(self._head_rows, self._head.shape[0] - r)
            data = np.frombuffer(self._slots[slot], np.uint16, rows * H, at).reshape(rows, H)
            yield r, Param(data, self._head.dtype, HEAD)

    def stats(self):
        return {"trunk_bytes_read": self.reader.bytes_read, "trunk_read_seconds": self.reader.read_seconds,
                "trunk_decode_seconds": self.reader.decode_seconds, "trunk_codec": self.trunk.codec,
                "trunk_wait_seconds": self.wait_seconds, "pinned_layers": len(self.layout.pinned),
                "pinned_coded": self.layout.held,
                "head_pinned": self.layout.head_pinned, "ring_slots": self.layout.ring_slots,
                "ring_slot_bytes": self.layout.slot_bytes,
                "trunk_read_mode": self.reader.mode,
                "trunk_reads_checked": self.options.check_reads or self.trunk.codec != RAW}

    def close(self):
        for prefault in self._prefaults:
            prefault.stop()
        self._reader.shutdown(wait=True)
        self.reader.close()


@hookimpl(trylast=True)
def k3_trunk_placers():
    return [PinnedPlacer]
