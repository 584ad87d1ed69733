"""A NaN or an infinity in the checkpoint is named where it enters the forward pass: exit 2, the message naming the
tensor and its layer (or the token ids whose embedding rows are bad) and the count, before any token it would
change is produced — not blamed on a layer's output, not sampled. Each row plants one value in a copy of the tiny
model (the checkpoint then comes with it: its checksums recorded after) and runs `k3 run` with the resident placer
or the pinned one over a pack made after planting, streaming every layer or pinning every one."""
from __future__ import annotations

import math
import shutil

import numpy as np
import pytest

from k3core import EngineConfig, open_engine
from k3core.errors import CheckpointError
from k3core.format.scan import record_tensor_sums
from k3core.cli.main import main
from k3core.interfaces import Param, Weights
from k3core.io.pack import pack
from k3core.format.checkpoint import HEAD, PREFIX, layer_prefix, open_checkpoint
from k3core.model.engine import Engine
from k3core.testmodel.make import SHAPES
from k3core.plugin_manager import new_plugin_manager
from k3core.plugins.resident import ResidentPlacer
from k3core.testing.engines import greedy_run
from k3core.testing.placers import offering

EMBED = PREFIX + "embed_tokens.weight"
VOCAB, HIDDEN = SHAPES["tiny"]["vocab_size"], SHAPES["tiny"]["hidden_size"]
PROMPT, GEN = (0, 1, 2), 3
# what is planted: (tensor, element, the layer the message names or None)
TENSORS = {
    "A_log": (layer_prefix(5) + "self_attn.A_log", 2, 5),  # a meaningful head (2 of 4)
    "norm": (layer_prefix(6) + "post_attention_layernorm.weight", 7, 6),
    "dt_bias": (layer_prefix(9) + "self_attn.dt_bias", 11, 9),
    "conv": (layer_prefix(10) + "self_attn.k_conv1d.weight", 13, 10),
    "e_score_bias": (layer_prefix(2) + "block_sparse_moe.gate.e_score_correction_bias", 4, 2),
    "final norm": (PREFIX + "norm.weight", 5, None),
}
EMBED_ROWS = ("prompt id", "first generated id", "unused id")  # whose embedding row is planted
VALUES = {"+inf": math.inf, "-inf": -math.inf, "NaN": math.nan}
PLACERS = {"resident": [], "pinned, every layer streamed": ["--pin-layers", "0"],
           "pinned, every layer pinned": ["--pin-layers", "99"]}


def rows():
    """Every target × value × placer; `make test` runs each target in each placer once, the values rotating."""
    out = []
    for t, target in enumerate([*TENSORS, *EMBED_ROWS]):
        for p, placer in enumerate(PLACERS):
            for v, value in enumerate(VALUES):
                full = v != (t + p) % len(VALUES)
                out.append(pytest.param(target, value, placer, id=f"{target}:{value}:{placer}",
                                        marks=[pytest.mark.faults_full] if full else []))
    return out


def plant(model, name: str, element: int, value: float) -> None:
    """Element `element` of tensor `name` becomes `value` (F32 as is, BF16 its top 16 bits), then the checksums are
    recorded again: a checkpoint that came with the value, not one damaged after recording."""
    ckpt = open_checkpoint(model)
    info = ckpt.index[name]
    ckpt.close()
    f32 = np.array(value, "<f4")
    raw, size = (f32.tobytes(), 4) if info.dtype == "F32" else ((f32.view("<u4") >> 16).astype("<u2").tobytes(), 2)
    with open(info.file, "r+b") as f:
        f.seek(info.offset + element * size)
        f.write(raw)
    record_tensor_sums(model)


@pytest.fixture(scope="module")
def clean_ids(tiny_model):
    """The ids the intact model generates after PROMPT."""
    return greedy_run(tiny_model, prompt=PROMPT, steps=GEN)[0]


def embed_token(which: str, clean_ids) -> int:
    """The token id whose embedding row an EMBED_ROWS target plants."""
    return {"prompt id": PROMPT[1], "first generated id": clean_ids[0],
            "unused id": max(set(range(VOCAB)) - {*PROMPT, *clean_ids})}[which]


def argv(model, tmp_path, placer: str) -> list[str]:
    """`k3 run` argv for `placer`: the pinned placer gets a pack of the model as it is now."""
    argv = ["run", str(model), "--ids", ",".join(map(str, PROMPT)), "--gen", str(GEN), "--quiet"]
    if PLACERS[placer]:
        pack(model, tmp_path / "trunk")
        argv += ["--trunk", str(tmp_path / "trunk"), *PLACERS[placer]]
    return argv


@pytest.mark.parametrize("target, value, placer", rows())
def test_a_non_finite_weight_is_named_where_it_enters(tiny_model, clean_ids, tmp_path, capsys, target, value, placer):
    model = shutil.copytree(tiny_model, tmp_path / "m")
    if target in TENSORS:
        (name, element, layer), token = TENSORS[target], None
    else:
        name, layer, token = EMBED, None, embed_token(target, clean_ids)
        element = token * HIDDEN + 3
    plant(model, name, element, VALUES[value])
    code = main(argv(model, tmp_path, placer))
    out, err = capsys.readouterr()
    if target == "unused id":  # a row no pass gathers stops nothing
        assert code == 0, err
        assert out.split() == [str(i) for i in clean_ids]
        return
    assert code == 2, err
    assert f"tensor '{name}'" in err and f"1 non-finite value(s) (1 {value})" in err, err
    assert "output is not finite" not in err, err  # named where it enters, not where its effect shows
    if layer is not None:
        assert f"layer {layer}'s " in err, err
    if token is not None:
        assert f"the embedding rows of token id(s) {token} hold" in err, err
    assert out == "", out  # `--ids` prints the ids when the run ends: no id it would change is printed
    assert "Traceback" not in err


def test_the_intact_model_runs_in_every_placer(tiny_model, clean_ids, tmp_path, capsys):
    """The rows above fail only because of the planted value."""
    for i, placer in enumerate(PLACERS):
        assert main(argv(tiny_model, tmp_path / str(i), placer)) == 0
        assert capsys.readouterr().out.split() == [str(i) for i in clean_ids]


def test_a_batch_names_every_bad_embedding_row_once(tiny_model, tmp_path):
    model = shutil.copytree(tiny_model, tmp_path / "m")
    for token, value in ((7, math.nan), (9, math.inf), (9, -math.inf)):
        plant(model, EMBED, token * HIDDEN + (1 if value == -math.inf else 0), value)
    with open_engine(EngineConfig(model, sequences=2)) as engine, pytest.raises(CheckpointError) as e:
        engine.forward_batch([([3, 9, 4], engine.new_state()), ([9, 7], engine.new_state())])
    assert "token id(s) 7, 9 hold 3 non-finite value(s) (1 NaN, 1 +inf, 1 -inf)" in str(e.value)
    assert e.value.tensor == EMBED and e.value.exit_code == 2


class FreshPlacer(ResidentPlacer):
    """Hands out every layer read anew, in a new Weights object each pass (as a streamed layer comes); from the
    second pass on, layer 4's A_log holds an infinity — as if its bytes had changed between two reads."""

    name = "fresh"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.passes = 0

    def layer(self, layer):
        self.passes += layer == 0
        w = super().layer(layer)
        params = {name: Param(p.data.copy(), p.dtype, p.name) for name, p in w.items()}
        if layer == 4 and self.passes >= 2:
            params["self_attn.A_log"].data[1] = np.inf
        return Weights(w.prefix, params)


def test_a_layer_read_anew_is_checked_on_every_read(tiny_model):
    engine = Engine(EngineConfig(tiny_model, trunk_placer="fresh"), pm=new_plugin_manager([offering(FreshPlacer)]),
                    available=1 << 40)
    with engine:
        state = engine.new_state()
        engine.forward(list(PROMPT), state)
        with pytest.raises(CheckpointError) as e:
            engine.forward([5], state)
    assert e.value.tensor == layer_prefix(4) + "self_attn.A_log"
    assert "layer 4's self_attn.A_log holds 1 non-finite value(s) (1 +inf)" in str(e.value)


@pytest.fixture(scope="module")
def tiny_pack(tiny_model, tmp_path_factory):
    trunk = tmp_path_factory.mktemp("trunk") / "t"
    pack(tiny_model, trunk)
    return trunk


@pytest.mark.parametrize("pin_layers, streamed", [(None, False), (99, False), (0, True)],
                         ids=["resident", "pinned", "streamed"])
def test_pinned_layers_are_scanned_once_and_streamed_ones_on_every_read(tiny_model, tiny_pack, monkeypatch, pin_layers,
                                                                         streamed):
    from k3core.model import finite

    scanned = []
    monkeypatch.setattr(finite, "check_small", lambda w, layer: scanned.append(layer))
    trunk = {} if pin_layers is None else {"trunk": tiny_pack, "pin_layers": pin_layers}
    passes = (PROMPT, [5], [6])
    with open_engine(EngineConfig(tiny_model, **trunk)) as engine:
        state = engine.new_state()
        for ids in passes:
            engine.forward(list(ids), state)
        layers = engine.config.num_hidden_layers
    assert len(scanned) == (layers * len(passes) if streamed else layers) + 1, scanned  # + the model level, once


@pytest.mark.parametrize("placer", PLACERS)
def test_a_non_finite_lm_head_row_is_named_with_its_token_id(tiny_model, tmp_path, capsys, placer):
    """lm_head is a BF16 matrix, not scanned when bound: a bad row shows in its logits, and is named there."""
    model = shutil.copytree(tiny_model, tmp_path / "m")
    plant(model, HEAD, 77 * HIDDEN + 5, math.nan)
    code = main(argv(model, tmp_path, placer))
    out, err = capsys.readouterr()
    assert code == 2, err
    assert "lm_head's rows for token id(s) 77 hold 1 non-finite value(s) (1 NaN)" in err and out == "", err
