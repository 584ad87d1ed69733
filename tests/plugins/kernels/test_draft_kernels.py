"""The draft trunk's products (int8_linear, int4_linear: native/kernels.h, docs/NUMERICS.md) on every kernel backend:
the definition written out here in plain Python floats over the format's own reader (quantize, unpack_int4), byte for
byte; and the draft model's logits byte-identical on every native backend, at 1 and 2 threads, for a pass of many
rows and for one row at a time, its rolled-back state the state that never saw the rejected ids (the kernel table,
k3core/testing/kernel_cases.py, holds the adversarial cases)."""
from __future__ import annotations

import numpy as np
import pytest

from k3core import EngineConfig, _native, open_engine
from k3core.io import draft_pack, pack
from k3core.io.draft_trunk import INT4, INT8, DraftSpec, DraftTensor, default_dir, draft_linear, open_draft_trunk, \
    quantize, unpack_int4
from k3core.model.draft_weights import DraftPlacer
from k3core.model.engine import DraftModel
from k3core.plugins.native_kernels import NativeKernels
from k3core.plugins.reference_kernels import ReferenceKernels

IDS = [int(i) for i in np.random.default_rng(0).integers(0, 200, 12)]
NATIVE = _native.available_backends()


def backends():
    yield ReferenceKernels()
    for name in NATIVE:
        for threads in (1, 2):
            k = NativeKernels(name)
            k.set_threads(threads)
            yield k


def by_hand(w, x, row_scale=None) -> np.ndarray:
    """The contract in Python floats (IEEE doubles): 16 lanes, lane i mod 16, fold 8, 4, 2, 1; then the row's scale
    (int8); then float32."""
    y = np.empty((len(x), len(w)), np.float32)
    for t, xt in enumerate(x):
        for o, wo in enumerate(w):
            acc = [0.0] * 16
            for i, (a, b) in enumerate(zip(wo, xt)):
                acc[i % 16] += float(a) * float(b)
            for width in (8, 4, 2, 1):
                acc[:width] = [acc[j] + acc[j + width] for j in range(width)]
            y[t, o] = np.float32(acc[0] if row_scale is None else float(row_scale[o]) * acc[0])
    return y


@pytest.mark.parametrize("kind", [INT8, INT4])
@pytest.mark.parametrize("cols", [37, 64, 70])
@pytest.mark.parametrize("cancelling", [False, True])
def test_every_backend_gives_the_definition_on_the_format_s_own_codes(kind, cols, cancelling):
    """Cancelling: columns s and s + 8 (s = 0, 16, …) get equal weights and opposite large x, so their products cancel
    exactly where lane j meets lane j + 8 in the fold, and the small terms survive only in the contract's order."""
    r = np.random.default_rng(cols)
    w = r.standard_normal((7, cols)).astype(np.float32)
    w[2] = 0  # a row of zeros: scale 0
    x = (r.standard_normal((5, cols)) * 3).astype(np.float32)
    for s in range(0, cols - 8, 16) if cancelling else ():
        w[:, s + 8] = w[:, s]
        x[:, s], x[:, s + 8] = 1e15, -1e15
    data, scales = quantize(kind, w, "w")
    t = DraftTensor("w", kind, (7, cols), "BF16", data, scales)
    if kind == INT8:
        want = by_hand(data.astype(int).tolist(), x.tolist(), scales.tolist())
    else:  # code · scale of each column, as the format's reader unpacks them: exact in a double
        codes = unpack_int4(data)[:, :cols].astype(int).tolist()
        w64 = [[c * float(scales[o, i // 32]) for i, c in enumerate(row)] for o, row in enumerate(codes)]
        want = by_hand(w64, x.tolist())
    if not cancelling:
        assert np.abs(want - x @ t.dequantized().T).max() < 1e-3 * np.abs(want).max()  # it is the draft's product
    for k in backends():
        assert draft_linear(t, x, k).view(np.uint32).tobytes() == want.view(np.uint32).tobytes(), k.name
        rows = [draft_linear(t, x[i:i + 1], k) for i in range(len(x))]
        assert np.concatenate(rows).tobytes() == want.tobytes(), k.name


@pytest.fixture(scope="module")
def packed(tiny_model, tmp_path_factory):
    """The tiny model's packed trunk with an int8 and an int4 draft of every layer."""
    trunk = tmp_path_factory.mktemp("draft-kernels") / "trunk"
    pack.pack(tiny_model, trunk)
    for kind in ("int8", "int4"):
        draft_pack.derive_draft(trunk, DraftSpec(kind, tuple(range(13))))
    return trunk


def draft_logits(tiny_model, packed, backend, threads):
    """{kind: (logits of IDS in one pass, the same ids one at a time)} of the draft models on `backend`."""
    out = {}
    with open_engine(EngineConfig(tiny_model, trunk=packed, kernels=backend, threads=threads)) as engine:
        for kind in ("int8", "int4"):
            draft = open_draft_trunk(default_dir(packed, kind), engine.placer.trunk)
            model = DraftModel(engine, DraftPlacer(engine.placer, draft, engine.config.num_hidden_layers), 1)
            state = model.new_state()
            alone = np.concatenate([model.forward([i], state, all_logits=True) for i in IDS])
            out[kind] = model.logits(IDS), alone
    return out


def test_the_draft_model_s_logit_bytes_are_the_same_on_every_backend_thread_count_and_batch(tiny_model, packed):
    runs = {(b, t): draft_logits(tiny_model, packed, b, t) for b in ("reference", *NATIVE) for t in (1, 2)}
    want = runs["scalar", 1]
    for (backend, threads), got in runs.items():
        for kind, (batch, alone) in got.items():
            assert batch.tobytes() == alone.tobytes(), (backend, threads, kind)  # many rows = one at a time
            if backend == "reference":  # numpy's exp and tanh (bit_exact False): the same ids, logits to a rounding
                assert (batch.argmax(1) == want[kind][0].argmax(1)).all(), kind
                assert np.abs(batch - want[kind][0]).max() <= 1e-5 * np.abs(want[kind][0]).max(), kind
            else:
                assert batch.tobytes() == want[kind][0].tobytes(), (backend, threads, kind)
    assert want["int8"][0].tobytes() != want["int4"][0].tobytes()


def test_a_rolled_back_draft_state_gives_the_bytes_of_the_state_that_never_saw_the_rejected_ids(tiny_model, packed):
    with open_engine(EngineConfig(tiny_model, trunk=packed)) as engine:
        draft = open_draft_trunk(default_dir(packed, "int4"), engine.placer.trunk)
        model = DraftModel(engine, DraftPlacer(engine.placer, draft, engine.config.num_hidden_layers), 2)
        a, drafted, c = IDS[:5], IDS[5:9], IDS[9:]
        state = model.new_state()
        model.forward(a, state)
        model.mark(state)
        model.forward(drafted, state)  # one pass of four rows
        model.rollback(state, 1)
        fresh = model.new_state()
        model.forward(a, fresh)
        model.forward(drafted[:1], fresh)  # a pass of one
        assert model.forward(c, state, all_logits=True).tobytes() == model.forward(c, fresh, all_logits=True).tobytes()
