"""The expert read size (the stores' `read_kib` option): an expert's aligned runs read in reads of at most that many
KiB give the very bytes, counts and greedy ids one read per run gives; every read stays aligned for O_DIRECT; a
size that is not 0 or a multiple of 4 in range is refused naming the option; a shard cut short is still unsound."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from k3core import EngineConfig, greedy_ids, open_engine
from k3core.errors import UnsoundRunError, UsageError
from k3core.files.aligned_io import ALIGN, aligned_buffer
from k3core.format.checkpoint import EXPERT_PARTS, expert_prefix, open_checkpoint
from k3core.io import expert_io
from k3core.io.expert_io import ExpertReader, expert_slot_bytes

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
FIELDS = ("w1_packed", "w1_scale", "w2_packed", "w2_scale", "w3_packed", "w3_scale")


@pytest.fixture
def checkpoint(tiny_model):
    ckpt = open_checkpoint(tiny_model)
    yield ckpt
    ckpt.close()


def read_all(ckpt, direct_io: bool, check: bool, read_kib: int):
    """Every routed expert of `ckpt`, a layer per request: (the slots' bytes, bytes_read, the reader's I/O mode)."""
    c = ckpt.config
    reader, slot = ExpertReader(ckpt, direct_io, check, 4, read_kib), expert_slot_bytes(ckpt)
    try:
        raw = []
        for layer in range(c.first_k_dense_replace, c.num_hidden_layers):
            bufs = [aligned_buffer(slot) for _ in range(c.num_experts)]
            got = reader.read([(layer, e, buf) for e, buf in enumerate(bufs)])
            for w in got:  # each expert's arrays are its tensors' bytes in the shard
                for part, field in zip(EXPERT_PARTS, FIELDS):
                    assert np.array_equal(getattr(w, field), ckpt.index.read(expert_prefix(w.layer, w.expert) + part))
            raw += [bytes(buf) for buf in bufs]
        return raw, reader.bytes_read, reader.mode
    finally:
        reader.close()


@pytest.mark.parametrize("check", [True, False], ids=["checked", "unchecked"])  # unchecked: the bytes alone tell
@pytest.mark.parametrize("direct_io", [True, False], ids=["direct", "buffered"])
def test_any_read_size_gives_the_bytes_and_counts_of_one_read_per_run(checkpoint, direct_io, check, monkeypatch):
    reads = []
    real = expert_io.read_into

    def recording(opened, view, offset, length):
        reads.append((offset, length, len(view), np.frombuffer(view, np.uint8).ctypes.data))
        return real(opened, view, offset, length)

    monkeypatch.setattr(expert_io, "read_into", recording)
    want, want_bytes, _ = read_all(checkpoint, direct_io, check, 0)
    runs = [length for _, length, *_ in reads]  # one read per run
    assert max(runs) > 8 << 10  # so 4 and 8 KiB split each run, and 1024 KiB does not
    for read_kib in (4, 8, 12, 1024):
        reads.clear()
        got, got_bytes, mode = read_all(checkpoint, direct_io, check, read_kib)
        assert got == want and got_bytes == want_bytes, (read_kib, mode)
        assert len(reads) == sum(-(-run // (read_kib << 10)) for run in runs)
        assert sum(length for _, length, *_ in reads) == want_bytes
        assert all(offset % ALIGN == 0 and length % ALIGN == 0 and address % ALIGN == 0  # as O_DIRECT wants
                   and length <= min(read_kib << 10, room) for offset, length, room, address in reads)


@pytest.mark.parametrize("store", ["lru", "direct"])
def test_greedy_ids_and_logits_do_not_depend_on_the_read_size(tiny_model, store, monkeypatch):
    def run(**options):
        config = EngineConfig(tiny_model, expert_store=store, store_options=options,
                              **({"cache_gb": 0.0} if store == "lru" else {}))
        with open_engine(config) as engine:
            ids, logits = greedy_ids(engine, PROMPT, 4)
            return ids, logits.tobytes(), engine.stats()["expert_bytes_read"]

    want = run()
    assert want[2] > 0  # the experts stream: the read size is in play
    lengths = []
    real = expert_io.read_into
    monkeypatch.setattr(expert_io, "read_into", lambda *a: lengths.append(a[3]) or real(*a))
    assert run(read_kib=4) == want
    assert lengths == [4 << 10] * (want[2] >> 12)  # the same bytes, in 4 KiB reads (the runs are whole pages)


@pytest.mark.parametrize("bad", [-4, 3, 6, 2 ** 21, True, "8", 4.0])
def test_a_read_size_other_than_0_or_a_multiple_of_4_in_range_is_refused(checkpoint, bad):
    with pytest.raises(UsageError, match=r"^read_kib: .*multiple of 4.*got " + repr(bad).replace(".", r"\.")):
        ExpertReader(checkpoint, read_kib=bad)


@pytest.mark.parametrize("bad", [6, "8"])
def test_an_engine_with_a_bad_read_size_does_not_open(tiny_model, bad):
    with pytest.raises(UsageError, match="read_kib") as err:
        open_engine(EngineConfig(tiny_model, expert_store="direct", store_options={"read_kib": bad}))
    assert repr(bad) in str(err.value)


def cut_shard(tiny_model, tmp_path, keep):
    """A copy of the model whose shard holding the last expert of layer 3 ends `keep(payload end)` bytes into that
    expert's run: (the copy opened, the expert, its payload end: the bytes of its run before the padding)."""
    model = shutil.copytree(tiny_model, tmp_path / "m")
    ckpt = open_checkpoint(model)
    last = ckpt.config.num_experts - 1
    reader = ExpertReader(ckpt, check=False)
    (piece,) = reader.layout(3, last)
    reader.close()
    payload_end = piece.parts[-1][2] + piece.parts[-1][3]
    with open(piece.file, "r+b") as f:  # the shard shrinks after it was indexed
        f.truncate(piece.start + keep(payload_end))
    return ckpt, last, payload_end


@pytest.mark.parametrize("direct_io", [True, False])
@pytest.mark.parametrize("keep", [lambda end: 100, lambda end: ALIGN, lambda end: ALIGN + 1, lambda end: end - 1],
                         ids=["inside the first read", "at a read's end", "one byte into a read", "all but a byte"])
def test_a_shard_cut_inside_an_expert_is_unsound_with_any_read_size(tiny_model, tmp_path, direct_io, keep):
    ckpt, last, payload_end = cut_shard(tiny_model, tmp_path, keep)
    reader, buf = ExpertReader(ckpt, direct_io, True, 4, 4), aligned_buffer(expert_slot_bytes(ckpt))
    try:
        with pytest.raises(UnsoundRunError, match=rf"expert {last} of layer 3 .*short read: \d+ of {payload_end} "
                                                  "bytes.*unsound"):
            reader.read([(3, last, buf)])
        assert reader.bytes_read == 0
    finally:
        reader.close()
        ckpt.close()


@pytest.mark.parametrize("direct_io", [True, False])
def test_a_shard_that_ends_at_an_expert_s_last_byte_still_reads_it(tiny_model, tmp_path, direct_io):
    ckpt, last, payload_end = cut_shard(tiny_model, tmp_path, lambda end: end)
    assert payload_end % ALIGN  # the padding after the expert is gone: the read covering it comes up short
    reader, buf = ExpertReader(ckpt, direct_io, True, 4, 4), aligned_buffer(expert_slot_bytes(ckpt))
    try:
        (w,) = reader.read([(3, last, buf)])
        for part, field in zip(EXPERT_PARTS, FIELDS):
            assert np.array_equal(getattr(w, field), ckpt.index.read(expert_prefix(3, last) + part))
    finally:
        reader.close()
        ckpt.close()
