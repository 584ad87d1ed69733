"""Batched generation: several sequences advanced together, one forward pass per step for all of them
(`Engine.forward_batch`: each trunk layer bound once, each distinct expert read once for every row). Each
sequence yields exactly the ids, logits and decode state it gets alone with generate_ids — the kernels give
a row the same bits in any batch, attention runs per sequence, and a pick sees only its own logits.

Sequences join (`add`) and leave (`remove`) between steps, so a server can let users come and go. A new
prompt is forwarded within the steps, at most `engine.prefill_chunk` prompt ids per pass (shared by the
prompts waiting), beside the other sequences' single decode rows.

A sequence added with a Speculation verifies drafted ids in the same passes: its row is the last id and
up to k drafted ones, and a step emits the ids the model agreed with (one pick, one PRNG draw, per id, as
generate_ids does). The state is rolled back to what the consumer kept: all of them when the sequence goes
on to the next step, or the `used` ones given to `remove`.

A sequence added with `checkpoints` has its state kept at those prompt positions by the passes that forward them
(Engine keep_at: no pass is cut there), and `on_checkpoint(state, position)` called after each such pass (a
prompt cache keeping it).

A sequence added with `prompt_rows` has its prompt forwarded with every position's logits, handed to that
callback chunk by chunk (rows [n, V], row j the logits after the chunk's j-th id): what scoring the prompt
(teacher-forced log-probabilities) needs, in the passes that forward it anyway. Its chunks are cut to hold at
most SCORED_LOGITS_BYTES of logits (102 ids on K3's vocabulary), within the plan's working buffers.

A sequence whose sampler fails (its grammar cannot go on, NaN logits in its row) leaves the batch alone: `step`
finishes the others' picks, then raises SequenceFailed holding their ids and the failures. A pick sees only its own
row and its own PRNG, so the others' ids are the ones they get without it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

import numpy as np

from ..errors import K3Error, UsageError
from .generate import (Drafting, Speculation, check_speculation, checked_prompt, pick, sources, tell_draft,
                       with_hidden)
from ..model.pass_cost import PassCost
from .sampling import Sampler

if TYPE_CHECKING:
    from ..model.engine import DecodeState, Engine
    from ..model.observer import Observer

SCORED_LOGITS_BYTES = 64 << 20  # the float32 logits of one scored prompt chunk, at most


class SequenceFailed(K3Error):
    """Some sequences' samplers failed in a step and those sequences left the batch (their states are dropped, not
    rolled back): `failed` maps each one's handle to its exception; `emitted` is what `step` gave the others."""

    def __init__(self, failed: dict[int, Exception], emitted: list["Emitted"]):
        super().__init__("; ".join(f"sequence {h}: {exc}" for h, exc in failed.items()))
        self.failed, self.emitted = failed, emitted


class Emitted(NamedTuple):
    handle: int
    token: int
    logits: np.ndarray
    last: bool  # the context is full: this sequence has left the batch


@dataclass
class _Sequence:
    state: DecodeState
    sampler: Sampler
    history: list[int]
    pending: list[int] = field(default_factory=list)  # ids to forward before the next pick
    speculation: Speculation | None = None
    drafting: Drafting | None = None
    drafted: list[int] = field(default_factory=list)  # in this step's row after the last id (the state is marked)
    emitted: int = 0                                    # ids the last verify pass emitted (kept unless told less)
    generated: int = 0
    prompt_rows: Callable[[np.ndarray], None] | None = None  # called with each prompt chunk's logits [n, V]
    checkpoints: list[int] = field(default_factory=list)     # prompt positions to keep the state at, ascending
    on_checkpoint: Callable[[DecodeState, int], object] | None = None


class BatchGenerator:
    """`add` sequences, call `step` for the ids each one produced in that pass, `remove` those that are
    done (stopped, finished or cancelled: the state then holds all ids but the last one used, as with
    generate_ids)."""

    def __init__(self, engine: Engine, observers: Sequence[Observer] = ()) -> None:
        self.engine, self.observers = engine, tuple(observers)
        # once a sequence speculates with auto: its pass cost, learning from every pass
        self.cost: PassCost | None = None
        self.sequences: dict[int, _Sequence] = {}
        self._next = 0

    def add(self, prompt: Sequence[int], state: DecodeState, sampler: Sampler | None = None,
            speculation: Speculation | None = None, prompt_rows: Callable[[np.ndarray], None] | None = None,
            checkpoints: Sequence[int] = (), on_checkpoint: Callable[[DecodeState, int], object] | None = None
            ) -> int:
        """A sequence joins: `state` holds a prefix of `prompt` (a fresh state, or a kept conversation's).
        `speculation` (a fresh one per sequence: draft sources keep per-generation state) verifies drafts.
        `prompt_rows` gets the logits of every prompt position forwarded (those `state` already holds have none).
        `on_checkpoint(state, position)` is called for each position of `checkpoints` inside the prompt once a pass
        forwarded it, the state's arrays there kept."""
        if len(self.sequences) >= self.engine.sequences:
            raise UsageError(f"the batch already holds {len(self.sequences)} sequences, the most this engine's memory "
                             "plan reserves decode state for (EngineConfig.sequences, --sequences)")
        if any(s.state is state for s in self.sequences.values()):
            raise UsageError("this decode state is already in the batch: each sequence needs its own")
        history = checked_prompt(self.engine, prompt, state)
        drafting = None
        if speculation is not None:
            check_speculation(self.engine, speculation, False)
            drafting = Drafting(self.engine, speculation)
            drafting.begin(history)
            if (speculation.adaptive or speculation.alternatives) and self.cost is None:
                self.cost = PassCost.of(self.engine)
                self.observers = (*self.observers, self.cost)
        handle, self._next = self._next, self._next + 1
        self.sequences[handle] = _Sequence(state, sampler or Sampler(), history, history[len(state.ids):], speculation,
                                           drafting,
                                           prompt_rows=prompt_rows,
                                           checkpoints=sorted({int(p) for p in checkpoints
                                                               if len(state.ids) < p < len(history)}
                                                              if on_checkpoint else ()),
                                           on_checkpoint=on_checkpoint)
        return handle

    def remove(self, handle: int, used: int | None = None) -> DecodeState | None:
        """The sequence leaves the batch; returns its decode state (None for a handle not in the batch).
        `used`: how many of the ids its last step emitted the consumer kept (default all); the state then
        holds every id before the last one kept."""
        seq = self.sequences.get(handle)
        if seq is None:
            return None
        if used is not None and not 1 <= used <= max(1, seq.emitted):
            raise UsageError(f"used must be 1..{max(1, seq.emitted)}, the ids the sequence's last step emitted; got {used}")
        del self.sequences[handle]
        kept = seq.emitted if used is None else used
        self._settle(seq, kept)
        if seq.speculation is not None:
            seq.drafting.end(seq.history[:len(seq.history) - (seq.emitted - kept)])
        return seq.state

    def _settle(self, seq: _Sequence, used: int) -> None:
        """Roll a verified pass back to the `used` ids kept: the last id forwarded and the drafts before them."""
        if seq.state.mark is not None:
            self.engine.rollback(seq.state, used)
        seq.drafted = []

    def __len__(self) -> int:
        return len(self.sequences)

    def step(self) -> list[Emitted]:
        """One forward pass for every sequence; the ids it produced, in the order the sequences joined (a
        sequence still forwarding its prompt produces none until its last chunk; a speculating one may
        produce several, in order)."""
        if not self.sequences:
            return []
        budget, batch, chunks, every, keep, failed = self.engine.prefill_chunk, [], [], [], [], {}
        for handle, seq in list(self.sequences.items()):
            self._settle(seq, seq.emitted)  # the previous step's ids were all kept
            n = 1 if len(seq.pending) == 1 else min(len(seq.pending), budget, self._chunk_limit(seq))
            if n == 0:
                continue
            if len(seq.pending) > 1:
                budget -= n
            row = seq.pending[:n]
            if n == 1 and len(seq.pending) == 1 and seq.speculation is not None:
                try:
                    row = row + self._drafts(seq)
                except Exception as exc:  # its sampler's constraint failed: it leaves, the others go on
                    failed[handle] = self._drop(handle, exc)
                    continue
            scored = seq.prompt_rows is not None and seq.generated == 0  # a chunk of the prompt
            batch.append((row, seq.state))
            chunks.append((handle, n, scored))
            every.append(len(row) > n or scored)
            keep.append([p for p in seq.checkpoints if p <= len(seq.state.ids) + n])
        drafts = {i: sources(self.sequences[h].speculation) for i, (h, _, _) in enumerate(chunks)
                  if self.sequences[h].speculation is not None}
        rows = self.engine.forward_batch(batch, all_logits=every, observers=with_hidden(self.observers, drafts),
                                         keep_at=keep)
        out = []
        for (handle, n, scored), logits, every_row, kept in zip(chunks, rows, every, keep):
            seq = self.sequences[handle]
            if scored:
                seq.prompt_rows(logits[:n])
            for p in kept:
                seq.on_checkpoint(seq.state, p)
            del seq.checkpoints[:len(kept)]
            del seq.pending[:n]
            if seq.pending:
                continue
            try:
                out += self._emit(handle, seq, logits[n - 1:] if every_row else logits[None])
            except Exception as exc:  # its pick failed (its grammar, its row): it leaves, the others go on
                failed[handle] = self._drop(handle, exc)
        if failed:
            raise SequenceFailed(failed, out)
        return out

    def _drop(self, handle: int, exc: Exception) -> Exception:
        """A failed sequence leaves the batch; its state is not rolled back (no consumer keeps it)."""
        seq = self.sequences.pop(handle)
        if seq.speculation is not None:
            seq.drafting.end(seq.history)
        return exc

    def _chunk_limit(self, seq: _Sequence) -> int:
        """Prompt ids one pass may forward for `seq`: a scored prompt's logits stay within SCORED_LOGITS_BYTES."""
        if seq.prompt_rows is None:
            return self.engine.prefill_chunk
        return max(1, SCORED_LOGITS_BYTES // (4 * self.engine.config.vocab_size))

    def _drafts(self, seq: _Sequence) -> list[int]:
        """Drafted ids to verify after the last id (the state is marked when there are any)."""
        seq.drafted = seq.drafting.propose(seq.history, seq.generated, self.engine.max_context - 1 - len(seq.history),
                                           seq.sampler)
        if seq.drafted:
            self.engine.mark(seq.state)
        return seq.drafted

    def _emit(self, handle: int, seq: _Sequence, rows: np.ndarray) -> list[Emitted]:
        out, drafted = [], seq.drafted
        for i in range(rows.shape[0]):
            token = pick(seq.sampler, rows[i], seq.history, self.observers)
            seq.history.append(token)
            seq.generated += 1
            full = len(seq.history) >= self.engine.max_context
            out.append(Emitted(handle, token, rows[i], full))
            if full or i >= len(drafted) or token != drafted[i]:
                break
        seq.emitted = len(out)
        if drafted:
            accepted = sum(1 for j, e in enumerate(out) if j < len(drafted) and e.token == drafted[j])
            seq.drafting.update(len(drafted), accepted)
            tell_draft(self.observers, drafted, accepted)
        if out[-1].last:
            self.remove(handle)
        else:
            seq.pending = [out[-1].token]
        return out
