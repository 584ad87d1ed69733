"""The forward pass: incremental decode, full recomputation, teacher forcing and chunked prefill
give the same bits; decode state forks cleanly; bad ids are refused."""
import numpy as np
import pytest

from k3core import _native
from k3core import EngineConfig, greedy_ids, open_engine
from k3core.errors import InputError

PROMPT = [5, 17, 200, 33, 91, 128, 7, 250]


@pytest.fixture(scope="module", params=["tiny", "small"])
def engine(request, model_factory):
    with open_engine(EngineConfig(model_factory(request.param))) as e:
        yield e


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def test_incremental_decode_equals_full_recomputation_bit_for_bit(engine):
    ids_inc, logits_inc = greedy_ids(engine, PROMPT, 6)
    ids_full, logits_full = greedy_ids(engine, PROMPT, 6, full_recompute=True)
    assert ids_inc == ids_full
    assert np.array_equal(bits(logits_inc), bits(logits_full))


def test_teacher_forcing_rows_equal_one_token_at_a_time(engine):
    all_rows = engine.logits(PROMPT)
    state = engine.new_state()
    one_by_one = [engine.forward([t], state) for t in PROMPT]
    assert np.array_equal(bits(all_rows), bits(np.stack(one_by_one)))


def test_chunked_prefill_equals_one_prefill(engine):
    whole = engine.forward(PROMPT, engine.new_state())
    state = engine.new_state()
    engine.forward(PROMPT[:3], state)
    assert np.array_equal(bits(engine.forward(PROMPT[3:], state)), bits(whole))


def test_a_copied_state_continues_identically(engine):
    state = engine.new_state()
    engine.forward(PROMPT, state)
    fork = state.copy()
    a = engine.forward([9], state)
    b = engine.forward([9], fork)
    assert np.array_equal(bits(a), bits(b)) and state.ids == fork.ids == PROMPT + [9]


def test_token_ids_outside_the_vocabulary_are_refused(engine):
    V = engine.config.vocab_size
    with pytest.raises(InputError, match=f"id {V} at position 1"):
        greedy_ids(engine, [1, V], 1)
    with pytest.raises(InputError, match="id -1 at position 0"):
        engine.forward([-1], engine.new_state())


def test_an_empty_prompt_is_refused(engine):
    with pytest.raises(InputError, match="empty"):
        greedy_ids(engine, [], 1)


@pytest.mark.parametrize("shape", ["tiny", "small"])
def test_every_native_backend_and_thread_count_gives_the_same_bits(model_factory, shape):
    runs = {}
    for backend in _native.available_backends():
        for threads in (1, 2, 5):
            with open_engine(EngineConfig(model_factory(shape), kernels=backend, threads=threads)) as e:
                ids, logits = greedy_ids(e, PROMPT, 5)
                runs[(backend, threads)] = (ids, bits(logits).tobytes(), bits(e.logits(PROMPT)).tobytes())
    first = next(iter(runs.values()))
    assert all(r == first for r in runs.values()), [k for k, r in runs.items() if r != first]


def test_a_nan_in_a_matrix_is_named_by_layer_and_tensor_not_sampled(tiny_model, tmp_path):
    """BF16 matrices are not scanned per read (small tensors are: tests/faults/test_nonfinite.py); the layer whose
    output is not finite is named, with the matrix that holds the NaN."""
    import shutil

    from k3core.errors import CheckpointError
    from k3core.format.scan import record_tensor_sums
    from k3core.format.checkpoint import layer_prefix, open_checkpoint

    model = shutil.copytree(tiny_model, tmp_path / "m")
    name = layer_prefix(5) + "block_sparse_moe.shared_experts.down_proj.weight"
    ckpt = open_checkpoint(model)
    info = ckpt.index[name]
    ckpt.close()
    with open(info.file, "r+b") as f:  # one value of the matrix becomes NaN (BF16 bits 0x7FC0)
        f.seek(info.offset + 2 * 3)
        f.write(np.array(0x7FC0, "<u2").tobytes())
    record_tensor_sums(model)  # a checkpoint that came with the NaN (a change after recording fails its checksum)
    with open_engine(EngineConfig(model)) as engine, pytest.raises(CheckpointError) as e:
        greedy_ids(engine, [1, 2, 3], 2)
    assert "layer 5's output is not finite: block_sparse_moe.shared_experts.down_proj.weight holds 1 non-finite " \
        "value(s) (1 NaN)" in str(e.value) and e.value.tensor == name and e.value.exit_code == 2


def test_an_output_that_overflows_with_finite_weights_is_not_blamed_on_a_tensor():
    from k3core.errors import CheckpointError
    from k3core.interfaces import Param, Weights
    from k3core.model.finite import output_error

    w = Weights("language_model.model.layers.2.", {"input_layernorm.weight": Param(np.ones(4, np.float32), "F32"),
                                                   "mlp.up_proj.weight": Param(np.zeros((2, 4), np.uint16), "BF16")})
    e = output_error(2, w)
    assert not isinstance(e, CheckpointError) and e.exit_code == 1
    assert "layer 2's output is not finite, though its input and its trunk weights are" in str(e)


@pytest.mark.parametrize("chunk", [1, 3, 7, 512])
def test_a_prompt_forwarded_in_chunks_gives_the_same_bits(small_model, chunk):
    prompt = list(range(5, 45))
    with open_engine(EngineConfig(small_model)) as one, open_engine(EngineConfig(small_model, prefill_chunk=chunk)) as e:
        assert e.prefill_chunk == chunk
        want, got = greedy_ids(one, prompt, 4), greedy_ids(e, prompt, 4)
    assert want[0] == got[0] and want[1].tobytes() == got[1].tobytes()


def test_a_stop_in_the_prompt_lands_between_layers_and_the_next_turn_is_exact(small_model):
    from k3core import Session, SamplingParams

    with open_engine(EngineConfig(small_model, prefill_chunk=4)) as engine:
        session, layers = Session(engine), []

        class Count:
            def on_layer(self, layer, n):
                layers.append(layer)

            def on_route(self, *a):
                pass

            def on_token(self, *a):
                pass

        stop_at = 15  # in the middle of the prompt's second chunk
        events = list(session.generate(list(range(3, 40)), SamplingParams(max_tokens=5), observers=[Count()],
                                       cancelled=lambda: len(layers) >= stop_at))
        assert events[-1].reason == "cancelled" and events[-1].ids == [] and len(layers) == stop_at
        assert session.state.ids == []  # the half-advanced state was dropped
        again = list(session.generate(list(range(3, 40)), SamplingParams(max_tokens=5)))[-1]
        assert again.ids == greedy_ids(engine, list(range(3, 40)), 5)[0]
