"""Memory buys speed, never a different answer: greedy ids and logit bytes are identical across
trunk placements (resident; pinned 0, some, all layers; rings of 2 and 3), expert stores (direct,
lru) and cache sizes, on the 13-layer model, a 25-layer one and the trained demo model; and
streaming faults are loud."""
import json
import os
import re
import shutil
import sys

import numpy as np
import pytest

from k3core.io import expert_io
from k3core.cli.main import main
from k3core import EngineConfig, greedy_ids, open_engine
from k3core.errors import TrunkError, UnsoundRunError
from k3core.io.pack import pack
from k3core.io.trunk import load_trunk

from ...conftest import DEMO_MODEL

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
CONFIGS = {
    "resident, lru 1 GB": dict(),
    "pinned 0 layers, ring 2, direct": dict(expert_store="direct", pin_layers=0, ring=2),
    "pinned 5 layers, ring 3, lru floor": dict(pin_layers=5, ring=3, cache_gb=0.0),
    "pinned all layers and head": dict(pin_layers=99),
    "pinned all layers, head streamed": dict(pin_layers=99, placer_options={"pin_head": False}),
    "pinned 1 layer, ring 2, lru small": dict(pin_layers=1, ring=2, cache_gb=0.0005),
    "pinned 1 layer, ring 2, lru floor, no prefetch": dict(pin_layers=1, ring=2, cache_gb=0.0,
                                                          store_options={"prefetch": False}),
    "budget-chosen pins, ring 3, lru large": dict(trunk_gb="60%", ring=3, cache_gb=2.0),
    "pinned 5 layers, ring 3, lru floor, deep prefetch, 4 KiB reads": dict(
        pin_layers=5, ring=3, cache_gb=0.0, store_options={"prefetch_depth": 3, "read_kib": 4}),
}


@pytest.fixture(scope="module", params=["tiny", "medium", "demo"])
def packed(request, model_factory, tmp_path_factory):
    model = DEMO_MODEL if request.param == "demo" else model_factory(request.param)
    trunk = tmp_path_factory.mktemp("trunk") / request.param
    pack(model, trunk, progress=None)
    return model, trunk


def run(model, trunk, **fields):
    if fields.get("trunk_gb") == "60%":  # a budget that pins some layers of whichever model: the ring and 60 %
        fields["trunk_gb"] = ring_and_share(model, trunk, fields["ring"], 0.6) / 1e9
    if "pin_layers" in fields or "trunk_gb" in fields:
        fields["trunk"] = trunk
    with open_engine(EngineConfig(model, **fields)) as engine:
        ids, logits = greedy_ids(engine, PROMPT, 6)
        return ids, logits.view(np.uint32).tobytes(), engine.stats()


def ring_and_share(model, trunk_dir, ring: int, share: float) -> int:
    """Bytes of a trunk budget holding a ring of `ring` slots and `share` of the layers' bytes."""
    from k3core.interfaces import Budget
    from k3core.format.checkpoint import open_checkpoint
    from k3core.plugins.pinned import PinnedOptions, layout

    trunk, config = load_trunk(trunk_dir), open_checkpoint(model).config
    streamed = layout(trunk, config, Budget(cache_gb=1.0, trunk_dir=trunk_dir, pinned_layers=0, ring_slots=ring),
                      PinnedOptions())
    layers = sum(trunk.layer(L).padded for L in range(config.num_hidden_layers))
    return streamed.ring_slots * streamed.slot_bytes + int(share * layers)


def test_every_budget_and_store_gives_the_resident_run_s_bits(packed):
    model, trunk = packed
    results = {name: run(model, trunk, **cfg) for name, cfg in CONFIGS.items()}
    want = results["resident, lru 1 GB"]
    for name, (ids, logits, _) in results.items():
        assert (ids, logits) == want[:2], name
    stats = {name: r[2] for name, r in results.items()}
    assert stats["pinned 0 layers, ring 2, direct"]["pinned_layers"] == 0
    assert stats["pinned 5 layers, ring 3, lru floor"]["ring_slots"] == 3
    assert stats["pinned all layers and head"]["ring_slots"] == 0
    assert stats["pinned all layers, head streamed"]["head_pinned"] is False
    assert 0 < stats["budget-chosen pins, ring 3, lru large"]["pinned_layers"]
    assert stats["pinned 0 layers, ring 2, direct"]["expert_hits"] == 0
    assert stats["budget-chosen pins, ring 3, lru large"]["expert_hits"] > 0
    hinted, plain = stats["pinned 5 layers, ring 3, lru floor"], stats["pinned 1 layer, ring 2, lru floor, no prefetch"]
    assert hinted["expert_prefetch_used"] > 0 and plain["expert_prefetched"] == 0
    assert hinted["expert_hits"] == plain["expert_hits"]  # a guess never changes what the cache keeps
    deep = stats["pinned 5 layers, ring 3, lru floor, deep prefetch, 4 KiB reads"]
    assert deep["expert_prefetched"] > hinted["expert_prefetched"] and deep["expert_hits"] == hinted["expert_hits"]


def test_streamed_layers_are_read_every_token_and_pinned_ones_once(packed):
    model, trunk = packed
    none_pinned = run(model, trunk, pin_layers=0)[2]["trunk_bytes_read"]
    all_pinned = run(model, trunk, pin_layers=99)[2]["trunk_bytes_read"]
    runs = load_trunk(trunk).runs
    layers = sum(r.length for k, r in runs.items() if k != "model")
    assert none_pinned - all_pinned >= 5 * layers  # six passes; the embedding's checked blocks are read by both
    assert all_pinned < layers + runs["model"].padded * (1 + len(PROMPT) + 6 + 4)


def test_a_truncated_trunk_bin_is_refused(packed, tmp_path):
    model, trunk = packed
    copy = shutil.copytree(trunk, tmp_path / "t")
    with open(copy / "trunk.bin", "r+b") as f:
        f.truncate((copy / "trunk.bin").stat().st_size // 2)
    with pytest.raises(TrunkError, match="truncated"):
        run(model, copy, pin_layers=1)


def test_a_trunk_packed_from_another_checkpoint_is_refused(packed, model_factory, tmp_path):
    model, _ = packed
    other = tmp_path / "other"
    pack(model_factory("tiny", seed=1), other, progress=None)
    with pytest.raises(TrunkError, match="another checkpoint"):
        run(model_factory("tiny"), other, pin_layers=1)


def test_an_expert_read_that_comes_up_short_ends_the_run_with_exit_4(tiny_model, tmp_path, capsys, monkeypatch):
    real = expert_io.ExpertReader._read_piece
    calls = []

    def failing(self, piece, view):
        calls.append(piece)
        return "short read: 0 of 4096 bytes" if len(calls) > 5 else real(self, piece, view)

    monkeypatch.setattr(expert_io.ExpertReader, "_read_piece", failing)
    report = tmp_path / "r.json"
    code = main(["run", str(tiny_model), "--ids", "1,2,3", "--gen", "3", "--json", str(report)])
    err = capsys.readouterr().err
    assert code == 4 and "unsound" in err and not report.exists()


def test_a_shard_truncated_after_indexing_is_unsound(tiny_model, tmp_path):
    model = shutil.copytree(tiny_model, tmp_path / "m")
    with open_engine(EngineConfig(model, expert_store="direct")) as engine:
        for shard in model.glob("model-0000[2-9]-*.safetensors"):
            with open(shard, "r+b") as f:
                f.truncate(shard.stat().st_size // 2)
        with pytest.raises(UnsoundRunError) as err:
            greedy_ids(engine, PROMPT, 2)
    assert err.value.exit_code == 4


def test_cli_runs_streamed_with_a_plan_and_a_report(tiny_model, tmp_path, capsys):
    trunk = tmp_path / "trunk"
    assert main(["pack", str(tiny_model), str(trunk), "--quiet"]) == 0
    report = tmp_path / "r.json"
    code = main(["run", str(tiny_model), "--ids", "1,2,3", "--gen", "3", "--trunk", str(trunk), "--pin-layers", "4",
                 "--ring", "3", "--cache-gb", "0.001", "--json", str(report)])
    out = capsys.readouterr()
    assert code == 0 and "memory plan" in out.err and "pinned trunk" in out.err
    data = json.loads(report.read_text())
    assert data["trunk_placer"] == "pinned" and data["stats"]["pinned_layers"] == 4
    for key in ("expert_true_hit_rate", "expert_retention", "io_share_of_wall", "trunk_read_rate", "memory_plan"):
        assert key in data


def test_the_report_puts_the_run_against_the_disk_floor(tiny_model, tmp_path, capsys):
    trunk = tmp_path / "trunk"
    assert main(["pack", str(tiny_model), str(trunk), "--quiet"]) == 0
    report = tmp_path / "r.json"
    assert main(["run", str(tiny_model), "--ids", "1,2,3", "--gen", "4", "--trunk", str(trunk), "--pin-layers", "0",
                 "--disk-floor", "0.05", "--json", str(report)]) == 0
    data = json.loads(report.read_text())
    probe, floor = data["disk_probe"], data["disk_floor_seconds_per_token"]
    assert probe["rate"] > 0 and probe["seconds"] >= 0.05
    assert floor == pytest.approx(data["bytes_read_per_token"] / probe["rate"])
    assert data["vs_disk_floor"] == pytest.approx(data["seconds_per_token"] / floor)
    err = capsys.readouterr().err
    assert "disk floor:" in err
    from k3core.files.device import stat_file
    if stat_file(trunk) is not None and data["stats"]["trunk_read_mode"] == "O_DIRECT":
        # every id after the first streams the whole trunk past the disk; a read the ring had in flight when the
        # first id came may count on either side, so not all of one id's bytes need show
        (disk,) = data["disk_activity"]
        assert disk["read_bytes"] >= 0.5 * 3 * data["bytes_read_per_token"] and disk["wall_seconds"] > 0
        assert f"disk {disk['device']} from the first id on:" in err


def test_a_plan_that_does_not_fit_is_refused_before_loading(tiny_model, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("k3core.plan.budget.mem_available", lambda: 200 << 20)  # a machine with 200 MB free
    code = main(["run", str(tiny_model), "--ids", "1", "--max-context", str(1 << 20)])
    err = capsys.readouterr().err
    assert code == 2 and "does not fit" in err and "MLA state" in err and "1048576 positions" in err


def test_the_context_limit_is_a_named_limit(tiny_model, capsys):
    for context in ("1", "-1", str(10**11)):
        assert main(["run", str(tiny_model), "--ids", "1", "--max-context", context]) == 2
        assert f"--max-context must be an integer in 16..1048576, or \"auto\", got {context}" in capsys.readouterr().err
    long = ",".join(["7"] * 40)
    assert main(["run", str(tiny_model), "--ids", long, "--max-context", "32"]) == 2
    assert "the prompt is 40 tokens, over the context limit of 32 (--max-context" in capsys.readouterr().err
    assert main(["run", str(tiny_model), "--ids", "1,2,3", "--max-context", "16", "--gen", "100000000000",
                 "--quiet"]) == 0
    assert len(capsys.readouterr().out.split()) == 13  # 3 + 13 = the 16 positions: clamped to the context


def test_a_budget_that_holds_everything_pins_everything(packed):
    from k3core.interfaces import Budget
    from k3core.format.checkpoint import open_checkpoint
    from k3core.plugins.pinned import PinnedOptions, layout
    model, trunk_dir = packed
    trunk, config, opts = load_trunk(trunk_dir), open_checkpoint(model).config, PinnedOptions()

    def lay(**budget):
        return layout(trunk, config, Budget(cache_gb=1.0, trunk_dir=trunk_dir, **budget), opts)

    everything = lay(pinned_layers=config.num_hidden_layers)
    chosen = lay(trunk_gb=everything.pinned_bytes / 1e9)
    assert chosen == everything and chosen.ring_slots == 0  # not stuck where a bigger ring was needed
    nothing = lay(pinned_layers=0)
    assert lay(trunk_gb=nothing.ring_slots * nothing.slot_bytes / 1e9).pinned == ()


def test_a_trunk_budget_below_the_ring_is_refused_naming_it(packed):
    from k3core.errors import PlanError
    model, trunk = packed
    with pytest.raises(PlanError, match="cannot hold even the ring: 2 slots"):
        open_engine(EngineConfig(model, trunk=trunk, trunk_gb=1e-6))


def _vm_flags(buffer) -> list[str]:
    """VmFlags of the mapping that holds `buffer`'s first byte (/proc/self/smaps)."""
    address = np.frombuffer(buffer, np.uint8).ctypes.data
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MADV_HUGEPAGE") or not os.path.exists(
    "/sys/kernel/mm/transparent_hugepage/enabled"), reason="the kernel has no transparent huge pages")
@pytest.mark.parametrize("store", ["lru", "direct"])
def test_buffers_reads_land_in_again_and_again_ask_for_huge_pages(tiny_model, tmp_path, store):
    """Expert slots, the trunk ring and the disk probe are madvise(MADV_HUGEPAGE) (`hg` in VmFlags): O_DIRECT
    reads into scattered 4 KB pages go to the device in ~1 MB requests (docs/STREAMING.md, "Where reads land")."""
    from k3core.files.aligned_io import aligned_buffer
    pack(tiny_model, tmp_path / "trunk", progress=None)
    with open_engine(EngineConfig(tiny_model, trunk=tmp_path / "trunk", pin_layers=0, expert_store=store)) as engine:
        assert "hg" in _vm_flags(engine.store._arena)
        assert all("hg" in _vm_flags(slot) for slot in engine.placer._slots)
        for prefault in [engine.store._prefault, *engine.placer._prefaults]:  # each allocates its buffer's pages
            prefault._thread.join(60)
        if _kernel() >= (5, 14):
            assert _resident_bytes(engine.store._arena) == len(engine.store._arena)
    assert "hg" not in _vm_flags(aligned_buffer(1 << 20))  # asked for, not the default


def test_read_time_counts_overlapping_reads_once():
    """A read rate is bytes over the wall time some read was in flight: a load's four threads, or a fetch and a
    prefetch at once, must not add their times up (that made a 4-thread load look 4× slower)."""
    from k3core.files import aligned_io
    now = iter([0.0, 5.0])  # the clock is read when the first read starts and when the last in flight ends
    clock = aligned_io.BusyClock(lambda: next(now))
    with clock.reading():
        with clock.reading():  # a second read while the first is in flight: no clock reading of its own
            pass
    assert clock.seconds == 5.0
    now = iter([7.0, 8.5])  # a later read alone
    with clock.reading():
        pass
    assert clock.seconds == 6.5


def _kernel() -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", os.uname().release)[:2])


def _resident_bytes(buffer) -> int:
    """Bytes of `buffer` whose pages are in RAM (mincore(2)), exactly its range whatever mapping holds it."""
    import ctypes
    n = len(buffer)
    pages = -(-n // 4096)
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(np.frombuffer(buffer, np.uint8).ctypes.data, n, vec) == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec) * 4096


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE and mincore are Linux's")
def test_a_prefault_allocates_a_buffer_s_pages_without_touching_its_bytes():
    """Prefault allocates the pages on its own thread, so the reads that fill a slot first do not fault them; a
    write that lands meanwhile (as a read would) keeps its bytes."""
    from k3core.files.aligned_io import Prefault, aligned_buffer
    buf = aligned_buffer(96 << 20, huge=True)
    prefault = Prefault(buf)
    buf[40 << 20:(40 << 20) + 5] = b"read!"  # while the thread may be at work
    prefault._thread.join(60)
    assert not prefault._thread.is_alive()
    assert buf[40 << 20:(40 << 20) + 5] == b"read!"
    if _kernel() >= (5, 14):  # MADV_POPULATE_WRITE
        assert _resident_bytes(buf) == len(buf)  # every page is there before any read asked for it
    plain = aligned_buffer(96 << 20)
    assert _resident_bytes(plain) == 0  # without it, nothing is


def test_a_deeper_prefetch_guesses_further_down_each_token_s_ranking(tiny_model):
    """prefetch_depth d: one token's guess is its top d·k experts by the router's ranking, the top k first."""
    from k3core.interfaces import ExpertStore
    from k3core.model.moe import prefetch_guess, route

    class Hinted(ExpertStore):
        def __init__(self, room):
            self.room, self.hints = room, []

        def prefetch_capacity(self):
            return self.room

        def prefetch(self, layer, experts):
            self.hints.append(list(experts))

        def fetch(self, layer, experts):
            raise AssertionError("a guess reads through prefetch only")

    with open_engine(EngineConfig(tiny_model)) as engine:
        c, kr = engine.config, engine.kernels
        L = next(L for L in range(c.num_hidden_layers) if not c.is_dense(L))
        w = engine.placer.layer(L)
        h = np.random.default_rng(0).standard_normal((1, c.hidden_size)).astype(np.float32)
        k = c.num_experts_per_token
        shallow, deep = Hinted(k), Hinted(min(c.num_experts, 2 * k))
        prefetch_guess(w, h, L, c, kr, shallow)
        prefetch_guess(w, h, L, c, kr, deep)
        ids, _ = route(w, kr.rmsnorm(h, w.vec("post_attention_layernorm.weight"), c.rms_norm_eps), c, kr)
    top = [int(e) for e in ids[0]]
    assert shallow.hints == [top] and len(set(deep.hints[0])) == deep.room and deep.hints[0][:k] == top
