"""Whole-engine runs the conformance checks compare: greedy ids and the bytes of every logit row."""
from __future__ import annotations

import numpy as np

from ..model.engine import Engine
from ..plan.engine_config import EngineConfig
from ..plugin_manager import get_plugin_manager, new_plugin_manager
from ..generation.generate import generate_ids, greedy_ids
from ..generation.sampling import Sampler, SamplingParams

PROMPT = (3, 1, 4, 1, 5, 9, 2, 6)
STEPS = 6


def greedy_run(model, plugins=(), prompt=PROMPT, steps=STEPS, **fields) -> tuple[list[int], bytes]:
    """(greedy ids, logit bytes) of `steps` ids after `prompt` on an engine of EngineConfig(model,
    **fields), with extra in-process `plugins` offered."""
    pm = new_plugin_manager(plugins) if plugins else get_plugin_manager()
    engine = Engine(EngineConfig(model, **fields), pm=pm, available=1 << 40)
    try:
        ids, logits = greedy_ids(engine, list(prompt), steps)
        return ids, np.ascontiguousarray(logits).view(np.uint32).tobytes()
    finally:
        engine.close()


def state_bytes(engine, state) -> bytes:
    """A decode state's ids and every array it holds, as bytes (equal bytes: the same state)."""
    parts = [np.asarray(state.ids, np.int64).tobytes()]
    for L, layer_state in enumerate(state.layers):
        for name, array in sorted(engine.attention_for(L).state_arrays(layer_state).items()):
            parts += [name.encode(), np.ascontiguousarray(array).tobytes()]
    return b"".join(parts)


def generation(engine, prompt, steps: int, params: SamplingParams | None = None, speculation=None):
    """(ids, logit bytes, decode state bytes) of `steps` ids after `prompt` from a fresh state, stopped and
    closed there — serial, or with `speculation` (a fresh Speculation: draft sources keep per-generation state)."""
    state, ids, rows = engine.new_state(), [], []
    steps_ = generate_ids(engine, list(prompt), state, Sampler(params or SamplingParams()), speculation=speculation)
    for token, logits in steps_:
        ids.append(token)
        rows.append(np.ascontiguousarray(logits).view(np.uint32).tobytes())
        if len(ids) == steps:
            break
    steps_.close()
    return ids, b"".join(rows), state_bytes(engine, state)
