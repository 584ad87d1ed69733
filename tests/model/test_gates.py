"""The three gates against oracles from the independent reference (tests/reference/, float64,
sharing no code with k3core): exact ids, logits within 1e-4 × max|ref|.

GATE 1 teacher forcing (every position), GATE 2 greedy decode by full recomputation (20/20), GATE 3
incremental decode (20/20) — on two generated shapes and on the trained demo model (two chat prompts;
trained weights have the confident logits and long stop-token paths random ones lack), with every
kernel backend this machine runs.
"""
import hashlib
import json

import numpy as np
import pytest

from k3core import _native
from k3core import EngineConfig, greedy_ids, open_engine

from ..conftest import DEMO_MODEL, ORACLES

TOLERANCE = 1e-4  # × max|ref|; the C engine's budget was 5.1e-4


CASES = {"tiny": "tiny-seed0", "small": "small-seed0", "demo-chat0": "demo-chat0", "demo-chat1": "demo-chat1"}


def oracle(case):
    data = np.load(ORACLES / f"{CASES[case]}.npz")
    meta = json.loads((ORACLES / f"{CASES[case]}.json").read_text())
    return {k: data[k] for k in data.files}, meta


def logit_error(got, want) -> float:
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


def gate1(engine, o):
    logits = engine.logits([int(t) for t in o["tf_ids"]])
    return list(logits.argmax(axis=1)) == list(o["tf_logits"].argmax(axis=1)), logit_error(logits, o["tf_logits"])


def gate_decode(engine, o, full_recompute):
    ids, logits = greedy_ids(engine, [int(t) for t in o["prompt_ids"]], len(o["greedy_ids"]), full_recompute)
    return ids == list(o["greedy_ids"]), logit_error(logits, o["greedy_logits"])


BACKENDS = ["reference"] + _native.available_backends()


@pytest.fixture(scope="module", params=[(s, b) for s in CASES for b in BACKENDS], ids=lambda p: "-".join(p))
def gated(request, model_factory):
    case, backend = request.param
    o, meta = oracle(case)
    model = DEMO_MODEL if case.startswith("demo") else model_factory(case)
    for name, sha in meta["files_sha256"].items():  # the oracle belongs to exactly these bytes
        assert hashlib.sha256((model / name).read_bytes()).hexdigest() == sha, name
    assert o["min_top2_gap"] > 1e-3  # no near-ties: exact ids are a fair demand
    with open_engine(EngineConfig(model, kernels=backend)) as engine:
        yield engine, o


def test_gate1_teacher_forcing(gated):
    engine, o = gated
    ids_equal, err = gate1(engine, o)
    assert ids_equal and err <= TOLERANCE, err


def test_gate2_greedy_decode_by_full_recomputation(gated):
    engine, o = gated
    ids_equal, err = gate_decode(engine, o, full_recompute=True)
    assert ids_equal and err <= TOLERANCE, err


def test_gate3_incremental_decode(gated):
    engine, o = gated
    ids_equal, err = gate_decode(engine, o, full_recompute=False)
    assert ids_equal and err <= TOLERANCE, err
