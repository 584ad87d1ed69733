"""State files: save + load continues bit for bit; another model's state is refused."""
import numpy as np
import pytest

from k3core import EngineConfig, open_engine
from k3core.model.state_file import StateFileError, load_state, save_state


def test_saved_state_continues_exactly(tiny_model, tmp_path):
    with open_engine(EngineConfig(tiny_model)) as engine:
        state = engine.new_state()
        engine.forward([5, 6, 7, 8], state)
        save_state(tmp_path / "s.npz", engine, state, extra={"note": "hi"})
        straight = engine.forward([9, 10], state)
        restored, extra = load_state(tmp_path / "s.npz", engine)
        assert restored.ids == [5, 6, 7, 8] and extra == {"note": "hi"}
        again = engine.forward([9, 10], restored)
    assert np.array_equal(straight.view(np.uint32), again.view(np.uint32))


def test_a_state_from_another_model_is_refused(tiny_model, model_factory, tmp_path):
    with open_engine(EngineConfig(tiny_model)) as engine:
        state = engine.new_state()
        engine.forward([1, 2], state)
        save_state(tmp_path / "s.npz", engine, state)
    with open_engine(EngineConfig(model_factory("small"))) as other:
        with pytest.raises(StateFileError, match="another model"):
            load_state(tmp_path / "s.npz", other)


def test_garbage_is_not_a_state_file(tiny_model, tmp_path):
    (tmp_path / "x.npz").write_bytes(b"not a zip")
    with open_engine(EngineConfig(tiny_model)) as engine, pytest.raises(StateFileError, match="not a k3 state file"):
        load_state(tmp_path / "x.npz", engine)


def test_a_state_from_the_same_shape_with_other_weights_is_refused(tiny_model, model_factory, tmp_path):
    with open_engine(EngineConfig(tiny_model)) as engine:
        state = engine.new_state()
        engine.forward([1, 2], state)
        save_state(tmp_path / "s.npz", engine, state)
    with open_engine(EngineConfig(model_factory("tiny", seed=1))) as other:
        with pytest.raises(StateFileError, match="weights differ"):
            load_state(tmp_path / "s.npz", other)


def rewrite(src, dst, change):
    """A copy of the npz at `src` with `change(arrays)` applied (arrays: name -> array, meta as JSON)."""
    import json

    with np.load(src, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(arrays["meta"].tobytes())
    change(arrays, meta)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    with open(dst, "wb") as f:
        np.savez(f, **arrays)
    return dst


BAD = {  # name -> (how the file is spoiled, what the refusal names)
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:300]), "not a k3 state file"),
    "flipped byte": (lambda p: p.write_bytes(p.read_bytes()[:200] + bytes([p.read_bytes()[200] ^ 0xFF])
                                             + p.read_bytes()[201:]), "damaged|not a k3 state file"),
    "no meta": ("drop:meta", "no 'meta' member"),
    "no ids": ("drop:ids", "member 'ids' is missing"),
    "ids out of the vocabulary": ("ids:999999", "ids outside 0..255"),
    "float ids": ("ids:float", "not a 1-D int64 array"),
    "a NaN in a KDA state": ("nan:layer0.S", "'layer0.S' holds NaN"),
    "a KDA state of the wrong shape": ("shape:layer0.S", "layer 0: KDA S has shape"),
    "a missing layer": ("drop:layer2.S", "member 'layer2.S' is missing"),
    "an extra member": ("extra", "unexpected member"),
    "a cache shorter than the ids": ("short:layer3.keys", "layer 3 caches 3 positions, but 4 ids"),
    "no extra": ("meta:extra", "meta key 'extra' is missing"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_every_part_of_a_state_file_is_checked_before_it_is_used(tiny_model, tmp_path, case):
    how, says = BAD[case]
    with open_engine(EngineConfig(tiny_model)) as engine:
        state = engine.new_state()
        engine.forward([5, 6, 7, 8], state)
        good = tmp_path / "good.npz"
        save_state(good, engine, state, extra={"conversation": {}})
        bad = tmp_path / "bad.npz"
        if callable(how):
            bad.write_bytes(good.read_bytes())
            how(bad)
        else:
            op, _, arg = how.partition(":")

            def change(arrays, meta):
                if op == "drop":
                    del arrays[arg]
                elif op == "ids":
                    arrays["ids"] = np.array([5, 6, 7, int(arg)], np.int64) if arg != "float" else \
                        arrays["ids"].astype(np.float64)
                elif op == "nan":
                    arrays[arg] = arrays[arg].copy()
                    arrays[arg].flat[0] = np.nan
                elif op == "shape":
                    arrays[arg] = arrays[arg][:, :-1]
                elif op == "extra":
                    arrays["layer99.S"] = np.zeros(3, np.float32)
                elif op == "short":
                    arrays[arg] = arrays[arg][:3]
                elif op == "meta":
                    del meta[arg]
            if op == "drop" and arg == "meta":
                with np.load(good, allow_pickle=False) as data:
                    kept = {k: data[k] for k in data.files if k != "meta"}
                with open(bad, "wb") as f:
                    np.savez(f, **kept)
            else:
                rewrite(good, bad, change)
        with pytest.raises(StateFileError, match=says) as e:
            load_state(bad, engine)
        assert str(bad) in str(e.value) and e.value.exit_code == 2


def test_a_bad_file_on_chat_load_leaves_the_conversation_as_it_was(small_model, tmp_path):
    from k3core import ChatSession, SamplingParams, load_tokenizer
    from k3core.cli.chat import _command

    with open_engine(EngineConfig(small_model)) as engine:
        chat = ChatSession(engine, load_tokenizer(small_model))
        for _ in chat.ask("hello there", SamplingParams(max_tokens=4)):
            pass
        before = (list(chat.conv.messages), list(chat.history), chat.session.state.ids[:])
        assert _command(f"/save {tmp_path / 'c.npz'}", chat, engine)
        (tmp_path / "broken.npz").write_bytes((tmp_path / "c.npz").read_bytes()[:500])
        rewrite(tmp_path / "c.npz", tmp_path / "noconv.npz", lambda a, m: m["extra"].pop("conversation"))
        rewrite(tmp_path / "c.npz", tmp_path / "badconv.npz",
                lambda a, m: m["extra"]["conversation"].update(history=[1, 2, 10**6]))
        for name, says in (("broken", "not a k3 state file"), ("noconv", "its conversation: not an object"),
                           ("badconv", "'history' must be a list of token ids")):
            with pytest.raises(StateFileError, match=says):
                _command(f"/load {tmp_path / name}.npz", chat, engine)
            assert (chat.conv.messages, chat.history, chat.session.state.ids) == before


def test_a_missing_file_a_directory_or_an_unreadable_file_is_named_as_such(tiny_model, tmp_path):
    import os

    (tmp_path / "afile").write_bytes(b"x")
    locked = tmp_path / "locked.npz"
    locked.write_bytes(b"PK\x05\x06" + bytes(18))
    locked.chmod(0)
    cases = [(tmp_path / "nowhere.npz", "the file does not exist"), (tmp_path, "is a directory"),
             (tmp_path / "afile" / "s.npz", "cannot read: Not a directory")]
    if os.geteuid() != 0:  # root reads it anyway
        cases.append((locked, "cannot read: Permission denied"))
    with open_engine(EngineConfig(tiny_model)) as engine:
        for path, says in cases:
            with pytest.raises(StateFileError) as e:
                load_state(path, engine)
            assert str(e.value) == f"{path}: {says}" and e.value.exit_code == 2
    locked.chmod(0o600)
