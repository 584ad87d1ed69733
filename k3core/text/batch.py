"""Batched generation: several sequences advanced together, one forward pass per step for all of them
(`Engine.forward_batch`: each trunk layer bound once, each distinct expert read once for every row). Each
sequence yields exactly the ids, logits and decode state it gets alone with generate_ids — the kernels give
a row the same bits in any batch, attention runs per sequence, and a pick sees only its own logits.

Sequences join (`add`) and leave (`remove`) between steps, so a server can let users come and go. A new
prompt is forwarded within the steps, at most `engine.prefill_chunk` prompt ids per pass (shared by the
prompts waiting), beside the other sequences' single decode rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import numpy as np

from ..errors import UsageError
from .generate import checked_prompt, pick
from .sampling import Sampler


class Emitted(NamedTuple):
    handle: int
    token: int
    logits: np.ndarray
    last: bool  # the context is full: this sequence has left the batch


@dataclass
class _Sequence:
    state: object
    sampler: Sampler
    history: list[int]
    pending: list[int] = field(default_factory=list)  # ids to forward before the next pick


class BatchGenerator:
    """`add` sequences, call `step` for the ids each one produced in that pass, `remove` those that are
    done (stopped, finished or cancelled: the state then holds all ids but the last one emitted, as with
    generate_ids)."""

    def __init__(self, engine, observers: Sequence = ()):
        self.engine, self.observers = engine, tuple(observers)
        self.sequences: dict[int, _Sequence] = {}
        self._next = 0

    def add(self, prompt: Sequence[int], state, sampler: Sampler | None = None) -> int:
        """A sequence joins: `state` holds a prefix of `prompt` (a fresh state, or a kept conversation's)."""
        if len(self.sequences) >= self.engine.sequences:
            raise UsageError(f"the batch already holds {len(self.sequences)} sequences, the most this engine's memory "
                             "plan reserves decode state for (EngineConfig.sequences, --sequences)")
        if any(s.state is state for s in self.sequences.values()):
            raise UsageError("this decode state is already in the batch: each sequence needs its own")
        history = checked_prompt(self.engine, prompt, state)
        handle, self._next = self._next, self._next + 1
        self.sequences[handle] = _Sequence(state, sampler or Sampler(), history, history[len(state.ids):])
        return handle

    def remove(self, handle: int):
        """The sequence leaves the batch; returns its decode state (None for a handle not in the batch)."""
        seq = self.sequences.pop(handle, None)
        return None if seq is None else seq.state

    def __len__(self) -> int:
        return len(self.sequences)

    def step(self) -> list[Emitted]:
        """One forward pass for every sequence; the ids it produced, in the order the sequences joined (a
        sequence still forwarding its prompt produces none until its last chunk)."""
        if not self.sequences:
            return []
        budget, batch, chunks = self.engine.prefill_chunk, [], []
        for handle, seq in self.sequences.items():
            n = 1 if len(seq.pending) == 1 else min(len(seq.pending), budget)
            if n == 0:
                continue
            if len(seq.pending) > 1:
                budget -= n
            batch.append((seq.pending[:n], seq.state))
            chunks.append((handle, n))
        rows = self.engine.forward_batch(batch, observers=self.observers)
        out = []
        for (handle, n), logits in zip(chunks, rows):
            seq = self.sequences[handle]
            del seq.pending[:n]
            if seq.pending:
                continue
            token = pick(seq.sampler, logits, seq.history, self.observers)
            seq.history.append(token)
            full = len(seq.history) >= self.engine.max_context
            out.append(Emitted(handle, token, logits, full))
            if full:
                self.remove(handle)
            else:
                seq.pending = [token]
        return out
