"""Id generation, the lower of the two generation layers: `generate_ids` forwards a prompt into a decode
state and yields (id, logits) one step at a time, picking each id with the sampler it is given and
telling the observers it is given. It knows no text: detokenising, stop strings and chat channels are
the text layer's (session.py), stop ids and limits the caller's (stop iterating).

The decode state reuse rule (SPEC §4.5) lives here: `state` must hold a prefix of `prompt`; only the
rest is forwarded, in chunks of at most `engine.prefill_chunk` ids (the bits do not depend on the
chunking; the working memory does). An id is forwarded only when the next one is asked for, so after
the caller stops, `state` holds every id but the last one yielded. Prompt and generated ids together
never exceed `engine.max_context`: a longer prompt is refused, and generation ends there.
"""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from ..errors import InputError
from .sampling import Sampler


def generate_ids(engine, prompt: Sequence[int], state, sampler: Sampler | None = None, *, observers=(),
                 full_recompute: bool = False) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (id, logits [V]) for each generated position, forever (the caller stops).

    `state` holds a prefix of `prompt` (an empty state holds the empty prefix). `sampler` picks from the
    logits and the ids so far (its repetition penalty's history); None is greedy. `full_recompute`
    forwards the whole sequence from a fresh state for every id (a check of the incremental path; `state`
    is then left as it was)."""
    history = [int(t) for t in prompt]
    if not history:
        raise InputError("the prompt is empty: give at least one token id")
    if len(history) > engine.max_context:
        raise InputError(f"the prompt is {len(history)} tokens, over the context limit of {engine.max_context} "
                         "(--max-context; the memory plan reserves decode state for that many positions)")
    done = state.ids
    if len(done) >= len(history) or history[:len(done)] != done:
        raise InputError(f"the decode state holds {len(done)} ids that are not a strict prefix of the "
                         f"{len(history)}-id prompt; start from a fresh state (engine.new_state())")
    sampler = sampler or Sampler()
    pending = history[len(done):]
    while True:
        if full_recompute:
            logits = engine.forward(history, engine.new_state(), observers=observers)
        else:
            logits = prefill(engine, pending, state, observers)
        token = sampler.pick(logits, history)
        for o in observers:
            o.on_token(token, logits)
        yield token, logits
        history.append(token)
        if len(history) >= engine.max_context:  # the context is full: this id can never be forwarded
            return
        pending = [token]


def prefill(engine, ids, state, observers=()) -> np.ndarray:
    """Forward `ids` in chunks of `engine.prefill_chunk`; the logits of the last position."""
    step = engine.prefill_chunk
    for at in range(0, len(ids) - step, step):
        engine.forward(ids[at:at + step], state, observers=observers)
    return engine.forward(ids[(len(ids) - 1) // step * step:], state, observers=observers)


def greedy_ids(engine, prompt: Sequence[int], n: int, full_recompute: bool = False) -> tuple[list[int], np.ndarray]:
    """Greedy decode of `n` ids from a fresh state: (ids, logits [n, V] float32)."""
    ids, rows = [], []
    for token, logits in generate_ids(engine, prompt, engine.new_state(), full_recompute=full_recompute):
        ids.append(token)
        rows.append(logits)
        if len(ids) == n:
            break
    return ids, np.array(rows, dtype=np.float32).reshape(n, engine.config.vocab_size)
