"""The draft model (k3core/model/engine.py DraftModel, its weights model/draft_weights.py): the engine's graph on a
draft trunk with fewer routed experts. Its logits need not match the model's, but with the model's own weights it must
give the model's bits (so the graph, the shared kernels, store, attention and embedding are the engine's); its states
follow mark and rollback; and the model's own bits never depend on a draft model having run beside it (issue 40)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from k3core import EngineConfig, open_engine
from k3core.errors import UsageError
from k3core.io import draft_pack, pack
from k3core.io.draft_trunk import DraftSpec, default_dir, open_draft_trunk
from k3core.model.draft_weights import DraftPlacer
from k3core.model.engine import DraftModel

from ..conftest import DEMO_MODEL

IDS = [int(i) for i in np.random.default_rng(0).integers(0, 200, 24)]


@pytest.fixture(scope="module")
def packed(tiny_model, tmp_path_factory):
    """The tiny model's packed trunk with an int8 draft of every layer and an int4 draft of the first three."""
    trunk = tmp_path_factory.mktemp("draft-model") / "trunk"
    pack.pack(tiny_model, trunk)
    draft_pack.derive_draft(trunk, DraftSpec("int8", tuple(range(13))))
    draft_pack.derive_draft(trunk, DraftSpec("int4", (0, 1, 2)), trunk / "some-layers")
    return trunk


@pytest.fixture
def engine(tiny_model, packed):
    with open_engine(EngineConfig(tiny_model, trunk=packed)) as e:
        yield e


def draft_model(engine, packed, top_k=None, where=None):
    draft = open_draft_trunk(where or default_dir(packed, "int8"), engine.placer.trunk)
    weights = DraftPlacer(engine.placer, draft, engine.config.num_hidden_layers)
    return DraftModel(engine, weights, top_k or engine.config.num_experts_per_token)


def with_the_model_s_weights(model, engine):
    """`model` holding the engine's exact weights instead of the draft's."""
    model.placer._layers = [engine.placer.layer(L) for L in range(engine.config.num_hidden_layers)]
    model.placer._model = engine.placer.model()
    model.placer._head = next(iter(engine.placer.head_blocks()))[1]
    return model


def test_with_the_model_s_own_weights_the_draft_model_gives_the_model_s_bits(engine, packed):
    want = engine.logits(IDS)
    same = with_the_model_s_weights(draft_model(engine, packed), engine)
    assert same.logits(IDS).tobytes() == want.tobytes()
    fewer = with_the_model_s_weights(draft_model(engine, packed, top_k=1), engine)
    assert fewer.logits(IDS).tobytes() != want.tobytes()  # one routed expert a token: another computation


def test_the_model_s_bits_never_depend_on_a_draft_model_beside_it(engine, packed):
    before = engine.logits(IDS)
    for k in (1, 2):
        draft_model(engine, packed, top_k=k).logits(IDS[::-1])  # its own experts through the shared store
    assert engine.logits(IDS).tobytes() == before.tobytes()


def test_a_draft_state_rolled_back_is_the_state_that_never_saw_the_rejected_ids(engine, packed):
    """Byte for byte: the draft kernels give a row the same bits in a pass of four rows as alone."""
    model = draft_model(engine, packed)
    a, drafted, c = IDS[:10], IDS[10:14], IDS[14:18]

    def after(kept):
        state = model.new_state()
        model.forward(a, state)
        model.mark(state)
        model.forward(drafted, state)
        model.rollback(state, kept)
        return model.forward(c, state, all_logits=True)

    fresh = model.new_state()
    model.forward(a, fresh)
    model.forward(drafted[:1], fresh)
    want = model.forward(c, fresh, all_logits=True)
    assert after(1).tobytes() == want.tobytes()
    assert np.abs(after(4) - want).max() > 1e-2 * np.abs(want).max()  # kept what was rejected: another state


def test_the_draft_model_agrees_with_the_model_more_often_with_more_experts(engine, packed):
    want = engine.logits(IDS).argmax(axis=1)
    agree = {k: float((draft_model(engine, packed, top_k=k).logits(IDS).argmax(axis=1) == want).mean())
             for k in (1, 2)}
    assert 0 < agree[1] < agree[2] <= 1


def test_a_draft_model_refuses_what_it_cannot_run(engine, packed):
    with pytest.raises(UsageError, match=r"1\.\.2 .*got 3"):
        draft_model(engine, packed, top_k=3)
    with pytest.raises(UsageError, match="--draft-layers"):
        draft_model(engine, packed, where=packed / "some-layers")


def test_bench_draft_reports_agreement_and_cost_on_the_demo_model(tmp_path, capsys):
    from k3core.cli.main import main

    trunk = tmp_path / "trunk"
    assert main(["pack", str(DEMO_MODEL), str(trunk), "--draft", "int8"]) == 0
    capsys.readouterr()
    assert main(["bench", "draft", "--trunk", str(trunk), "--turns", "1", "--top-k", "2,1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["top_k"] for r in doc["rows"]] == [2, 1] and doc["kind"] == "int8"
    for r in doc["rows"]:
        assert 0 <= r["agreement"] <= 1 and r["positions"] > 0 and r["vs_exact"] > 0
    assert doc["rows"][0]["agreement"] > 0.9  # the trained model: int8 with every expert picks its ids
    for bad, named in ((["--top-k", "3"], "--top-k takes routed experts per token in 1..2"),
                       (["--turns", "0"], "--turns takes 1..1000"), (["--kinds", "nosuch"], "of the kinds nosuch")):
        assert main(["bench", "draft", "--trunk", str(trunk), *bad]) == 2
        assert named in capsys.readouterr().err


def test_bench_draft_refuses_a_tokenizer_whose_ids_the_model_does_not_have(tiny_model, packed, capsys):
    from k3core.cli.main import main

    assert main(["bench", "draft", str(tiny_model), "--trunk", str(packed), "--tokenizer", str(DEMO_MODEL),
                 "--turns", "1"]) == 2
    assert "do not fit this model's vocabulary" in capsys.readouterr().err
