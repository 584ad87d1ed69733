"""The prompt cache (k3core/generation/prefix_cache.py): a prompt resumes from the deepest kept checkpoint of any
conversation, and the ids and logits are the bits a fresh forward gives — cold, warm, read back from disk after a
restart, at every RAM budget, and in a batch. A damaged or foreign file is dropped and recomputed; another model
never reads one; what RAM and disk hold stays within their limits."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from k3core import BatchGenerator, EngineConfig, K3Error, PrefixCache, load_tokenizer, open_engine
from k3core.testing.engines import state_bytes
from k3core.generation.generate import generate_ids
from k3core.generation.prefix_disk import SUFFIX

from ..conftest import DEMO_MODEL

STEPS = 4


@pytest.fixture(scope="module")
def engine():
    with open_engine(EngineConfig(DEMO_MODEL, max_context=4096, sequences=2)) as e:
        yield e


@pytest.fixture(scope="module")
def eom():
    return load_tokenizer(DEMO_MODEL).id_of("<|end_of_msg|>")


def prompts(eom, n=3, shared=600, own=(40, 70, 25), seed=0):
    """Prompts sharing `shared` ids and a message boundary, each then with its own ids."""
    r = np.random.default_rng(seed)
    base = r.integers(0, 700, shared).tolist() + [eom]
    return [base + r.integers(0, 700, own[i]).tolist() for i in range(n)]


def run(engine, prompt, cache=None):
    """(ids the state started with, [(id, logit bytes)] of STEPS greedy ids); the cache keeps what it is asked to."""
    state = cache.resume(prompt) if cache else engine.new_state()
    start, out = len(state.ids), []
    steps = generate_ids(engine, prompt, state, checkpoints=cache.positions(prompt, start) if cache else (),
                         on_checkpoint=cache.keep if cache else None)
    for token, logits in steps:
        out.append((token, logits.view(np.uint32).tobytes()))
        if len(out) == STEPS:
            break
    steps.close()
    if cache:
        cache.keep(state)
    return start, out


@pytest.fixture(scope="module")
def fresh(engine, eom):
    """Each prompt's run without a cache: what every cached run must equal."""
    return [run(engine, p)[1] for p in prompts(eom)]


def test_a_second_conversation_resumes_at_the_shared_boundary_with_the_same_bits(engine, eom, fresh, tmp_path):
    cache = PrefixCache(engine, 1 << 30, interval=256, boundaries=[eom], disk_dir=tmp_path, disk_bytes=1 << 30)
    p = prompts(eom)
    passes = engine.forward_passes
    run(engine, p[0])
    alone, passes = engine.forward_passes - passes, engine.forward_passes
    assert run(engine, p[0], cache) == (0, fresh[0])  # cold
    assert engine.forward_passes - passes == alone  # its checkpoints cut no pass: kept inside them
    before = engine.tokens_forwarded
    start, got = run(engine, p[1], cache)
    assert start == 601 and got == fresh[1]  # warm: from the boundary after the shared 600 ids
    assert engine.tokens_forwarded - before == len(p[1]) - 601 + STEPS - 1  # its own ids and the reply's
    assert run(engine, p[1], cache)[0] == len(p[1]) - 1  # the same prompt again: one id left to forward
    stats = cache.stats()
    assert stats["prompt_cache_hits"] == 2 and stats["prompt_cache_misses"] == 1
    assert stats["prompt_cache_reused_tokens"] == 601 + len(p[1]) - 1


@pytest.mark.parametrize("ram", [0, 100_000, 1 << 30])
def test_after_a_restart_and_at_every_ram_budget_the_bits_are_the_same(engine, eom, fresh, tmp_path, ram):
    p = prompts(eom)
    first = PrefixCache(engine, ram, interval=128, boundaries=[eom], disk_dir=tmp_path, disk_bytes=1 << 30)
    assert run(engine, p[0], first)[1] == fresh[0]
    assert first.ram <= ram and first.disk.bytes > 0
    again = PrefixCache(engine, ram, interval=128, boundaries=[eom], disk_dir=tmp_path, disk_bytes=1 << 30)
    assert again.ram == 0 and again.stats()["prompt_cache_checkpoints"] == first.stats()["prompt_cache_checkpoints"]
    for i in (1, 2, 0):
        start, got = run(engine, p[i], again)
        assert start > 600 and got == fresh[i]
        assert again.ram <= ram


def test_a_resumed_state_is_the_state_a_fresh_forward_gives(engine, eom, tmp_path):
    """Byte for byte, every array and id, at a checkpoint in the middle of an edge (the tree splits there)."""
    cache = PrefixCache(engine, 1 << 30, interval=10_000, boundaries=[], disk_dir=tmp_path, disk_bytes=1 << 30)
    r = np.random.default_rng(3)
    long = r.integers(0, 700, 300).tolist()
    state = engine.new_state()
    engine.forward(long, state)
    cache.keep(state)  # one edge of 300 ids
    state = engine.new_state()
    engine.forward(long[:137], state)
    cache.keep(state)  # splits it at 137
    for depth in (137, 300):
        got = cache.resume(long[:depth] + [5])
        want = engine.new_state()
        engine.forward(long[:depth], want)
        assert state_bytes(engine, got) == state_bytes(engine, want)
    restarted = PrefixCache(engine, 1 << 30, interval=10_000, boundaries=[], disk_dir=tmp_path, disk_bytes=1 << 30)
    want = engine.new_state()
    engine.forward(long, want)
    assert state_bytes(engine, restarted.resume(long + [5])) == state_bytes(engine, want)


def test_in_a_batch_each_resumed_sequence_gets_its_bits(engine, eom, fresh, tmp_path):
    cache = PrefixCache(engine, 1 << 30, interval=256, boundaries=[eom], disk_dir=tmp_path, disk_bytes=1 << 30)
    p = prompts(eom)
    run(engine, p[0], cache)
    batch, handles, got = BatchGenerator(engine), {}, {}
    for i in (1, 2):
        state = cache.resume(p[i])
        assert len(state.ids) == 601
        handles[batch.add(p[i], state, checkpoints=cache.positions(p[i], 601), on_checkpoint=cache.keep)] = i
        got[i] = []
    while any(len(v) < STEPS for v in got.values()):
        for e in batch.step():
            if len(got[handles[e.handle]]) < STEPS:
                got[handles[e.handle]].append((e.token, e.logits.view(np.uint32).tobytes()))
    assert got[1] == fresh[1] and got[2] == fresh[2]
    assert len(cache.resume(p[2]).ids) == len(p[2]) - 1  # kept as the batch forwarded it


def test_checkpoints_come_at_boundaries_breakpoints_intervals_and_the_last_id(engine, eom, tmp_path):
    cache = PrefixCache(engine, 1 << 30, interval=100, boundaries=[eom], disk_dir=None)
    prompt = [1] * 50 + [eom] + [2] * 200
    assert cache.positions(prompt, 0, extra=[75]) == [51, 75, 100, 200, 250]
    assert cache.positions(prompt, 99) == [100, 200, 250]
    state = engine.new_state()
    engine.forward(prompt[:100], state)
    cache.keep(state)
    assert 100 not in cache.positions(prompt, 0)  # kept already


def test_a_damaged_file_is_dropped_with_a_line_and_recomputed(engine, eom, fresh, tmp_path, caplog):
    p = prompts(eom)
    run(engine, p[0], PrefixCache(engine, 1 << 30, interval=256, boundaries=[eom], disk_dir=tmp_path,
                                  disk_bytes=1 << 30))
    files = sorted(tmp_path.rglob("*" + SUFFIX), key=lambda f: f.stat().st_size)
    for f in files:  # a flipped byte in the middle of every entry's arrays
        raw = bytearray(f.read_bytes())
        raw[len(raw) // 2] ^= 0x40
        f.write_bytes(bytes(raw))
    cache = PrefixCache(engine, 1 << 30, interval=256, boundaries=[eom], disk_dir=tmp_path, disk_bytes=1 << 30)
    with caplog.at_level(logging.WARNING, logger="k3.prompt_cache"):
        start, got = run(engine, p[1], cache)
    assert start == 0 and got == fresh[1]
    assert "fails its sha256" in caplog.text and cache.stats()["prompt_cache_dropped"] >= 1


def test_another_model_never_reads_this_models_files(engine, eom, model_factory, tmp_path, caplog):
    """Two checkpoints of one shape and config but other weights share a cache directory: neither resumes from
    the other's prefixes, and a file moved into the other's directory is dropped as foreign."""
    run(engine, prompts(eom)[0], PrefixCache(engine, 0, interval=256, boundaries=[eom], disk_dir=tmp_path,
                                             disk_bytes=1 << 30))
    a, b = model_factory("tiny", seed=0), model_factory("tiny", seed=1)
    prompt = list(range(1, 200))
    with open_engine(EngineConfig(a)) as ea, open_engine(EngineConfig(b)) as eb:
        ca = PrefixCache(ea, 0, interval=64, disk_dir=tmp_path, disk_bytes=1 << 30)
        run(ea, prompt, ca)
        cb = PrefixCache(eb, 0, interval=64, disk_dir=tmp_path, disk_bytes=1 << 30)
        assert ca.model != cb.model and cb.stats()["prompt_cache_checkpoints"] == 0
        assert run(eb, prompt, cb)[0] == 0
        for f in ca.disk.dir.iterdir():
            f.rename(cb.disk.dir / f.name)
        with caplog.at_level(logging.WARNING, logger="k3.prompt_cache"):
            cc = PrefixCache(eb, 0, interval=64, disk_dir=tmp_path, disk_bytes=1 << 30)
        assert "belongs to another model" in caplog.text
        assert run(eb, prompt, cc)[0] == len(prompt) - 1  # its own files still serve it


def test_ram_and_disk_stay_within_their_limits(engine, eom, tmp_path):
    cache = PrefixCache(engine, 200_000, interval=64, boundaries=[eom], disk_dir=tmp_path, disk_bytes=600_000)
    for seed in range(4):
        for p in prompts(eom, seed=seed):
            run(engine, p, cache)
            assert cache.ram <= 200_000 and cache.disk.bytes <= 600_000
    on_disk = sum(f.stat().st_size for f in cache.disk.dir.iterdir())
    assert on_disk == cache.disk.bytes
    ram_only = PrefixCache(engine, 150_000, interval=64, boundaries=[eom])
    for p in prompts(eom):
        run(engine, p, ram_only)
        assert ram_only.ram <= 150_000


def test_a_checkpoint_kept_at_one_memory_budget_serves_another(eom, fresh, tmp_path):
    """The demo model resident keeps the prompts; the same model streamed from a packed trunk with no layer pinned
    and the expert cache at its floor resumes from those files (the model key leaves the budget out: memory buys
    speed, never a different bit) and generates the resident engine's ids and logits."""
    from k3core.io.pack import pack

    trunk = tmp_path / "trunk"
    pack(DEMO_MODEL, trunk, progress=None)
    p = prompts(eom)
    with open_engine(EngineConfig(DEMO_MODEL, max_context=4096)) as resident:
        run(resident, p[0], PrefixCache(resident, 0, interval=256, boundaries=[eom], disk_dir=tmp_path / "cache",
                                        disk_bytes=1 << 30))
    streamed = EngineConfig(DEMO_MODEL, max_context=4096, trunk=trunk, pin_layers=0, cache_gb=0.0)
    with open_engine(streamed) as engine:
        cache = PrefixCache(engine, 0, interval=256, boundaries=[eom], disk_dir=tmp_path / "cache", disk_bytes=1 << 30)
        start, got = run(engine, p[1], cache)
        assert engine.placer.name == "pinned" and start == 601 and got == fresh[1]


def damaged(kind: str, raw: bytes) -> bytes:
    """An entry's bytes spoilt one way."""
    if kind == "cut short":
        return raw[:len(raw) // 3]
    if kind == "not an entry":
        return b"PK\x03\x04" + raw[4:]
    head_len = int.from_bytes(raw[8:16], "little")
    if kind == "another version":
        head = raw[16:16 + head_len].replace(b'"version": 1', b'"version": 9')
        return raw[:16] + head + raw[16 + head_len:]
    if kind == "a huge header":
        return raw[:8] + (1 << 40).to_bytes(8, "little") + raw[16:]
    raise ValueError(kind)


@pytest.mark.parametrize("kind, says", [("cut short", "fails its sha256"),
                                         ("not an entry", "is not a k3 prompt-cache entry"),
                                         ("another version", "is of another format or version"),
                                         ("a huge header", "-byte header, over")])
def test_an_entry_spoilt_any_way_is_dropped_naming_why_and_the_prefix_forwarded_again(engine, eom, fresh, tmp_path,
                                                                                       caplog, kind, says):
    p = prompts(eom)
    run(engine, p[0], PrefixCache(engine, 0, interval=256, boundaries=[eom], disk_dir=tmp_path, disk_bytes=1 << 30))
    for f in tmp_path.rglob("*" + SUFFIX):
        f.write_bytes(damaged(kind, f.read_bytes()))
    (next(tmp_path.iterdir()) / ".stale.k3p.999999999.1.tmp").write_bytes(b"left by a write that died")
    with caplog.at_level(logging.WARNING, logger="k3.prompt_cache"):
        cache = PrefixCache(engine, 0, interval=256, boundaries=[eom], disk_dir=tmp_path, disk_bytes=1 << 30)
        start, got = run(engine, p[1], cache)
    assert start == 0 and got == fresh[1] and says in caplog.text
    assert not list(tmp_path.rglob("*.tmp"))  # a dead writer's temporary file is gone


def test_a_state_not_kept_at_a_position_is_an_error_naming_what_was(engine):
    state = engine.new_state()
    engine.forward([1, 2, 3, 4], state, keep_at=[2])
    kept = engine.arrays_at(state, 2)
    assert {len(a["keys"]) for a in kept if "keys" in a} == {2} and all("S" in a or "keys" in a for a in kept)
    with pytest.raises(K3Error, match=r"no state kept at position 3 \(kept: \[\]\)"):
        engine.arrays_at(state, 3)


def test_an_entry_renamed_or_orphaned_is_dropped_with_a_line(engine, eom, fresh, tmp_path, caplog):
    """Whole, checksummed entries that have no place in the tree: one renamed by hand (its name is not its node),
    and those below an entry that was deleted (their parent is gone). Each is dropped, saying why, and the prefix
    forwarded again."""
    p = prompts(eom)
    run(engine, p[0], PrefixCache(engine, 0, interval=256, boundaries=[eom], disk_dir=tmp_path, disk_bytes=1 << 30))
    files = sorted(tmp_path.rglob("*" + SUFFIX), key=lambda f: f.stat().st_mtime)
    files[0].unlink()  # the first checkpoint written: the others hang below it
    files[-1].rename(files[-1].with_name("0" * 64 + SUFFIX))
    with caplog.at_level(logging.WARNING, logger="k3.prompt_cache"):
        cache = PrefixCache(engine, 0, interval=256, boundaries=[eom], disk_dir=tmp_path, disk_bytes=1 << 30)
        start, got = run(engine, p[1], cache)
    assert start == 0 and got == fresh[1]
    assert "holds another node than its name says" in caplog.text and "has no place in the tree" in caplog.text
