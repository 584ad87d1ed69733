"""Whole-engine runs the conformance checks compare: greedy ids and the bytes of every logit row."""
from __future__ import annotations

import numpy as np

from ..model.engine import Engine
from ..model.engine_config import EngineConfig
from ..plugin_manager import get_plugin_manager, new_plugin_manager
from ..text.generate import greedy_ids

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
