"""State files: save + load continues bit for bit; another model's state is refused."""
import numpy as np
import pytest

from k3core import EngineConfig, greedy_ids, open_engine
from k3core.io.state_file import StateFileError, load_state, save_state


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
