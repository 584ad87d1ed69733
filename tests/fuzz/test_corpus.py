"""Every input that once crashed a fuzz target, replayed: tests/fuzz/corpus/<target>/<name>.bin (formats in
corpus/README.md)."""
import base64
import json
from pathlib import Path

import pytest

from . import targets

CORPUS = Path(__file__).parent / "corpus"
CASES = sorted(CORPUS.glob("*/*.bin"))


@pytest.mark.parametrize("case", CASES, ids=[f"{c.parent.name}/{c.stem}" for c in CASES])
def test_a_once_crashing_input_is_now_handled(case, tiny_model):
    target, raw = case.parent.name, case.read_bytes()
    if target == "state_file":
        from k3core import EngineConfig, open_engine

        with open_engine(EngineConfig(tiny_model)) as engine:
            targets.state_file(raw, engine)
    elif target == "tokenizer":
        targets.tokenizer({name: base64.b64decode(data) for name, data in json.loads(raw).items()})
    else:
        getattr(targets, target)(raw)
