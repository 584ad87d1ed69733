"""The draft source kind: what proposes the ids a generation might continue with, and what the engine offers
it (DraftTarget)."""
from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

import numpy as np

from .base import Plugin

if TYPE_CHECKING:
    from ..format.config import Config


class DraftSource(Plugin):
    """Proposes the ids a generation might continue with, for speculative decoding. The engine forwards the
    last id and up to k proposed ones in one pass and keeps the longest prefix the model itself would have
    produced; a wrong proposal costs time, never a different id.

    Built by the engine as `cls(argument)` (the text after `:` in --draft NAME:ARGUMENT, or None), then
    `begin(prompt)` once per generation and `propose(history, generated, k)` before each verify pass."""

    memory_bytes: ClassVar[int] = 0  # what it keeps across generations unless told (`reserve`); the plan counts it
    uses_draft_model: ClassVar[bool] = False  # it runs DraftTarget.draft_model: the engine must hold one
    hidden_layers: ClassVar[tuple[int, ...]] = ()  # the model's layers whose hidden states it reads (see_hidden)

    def __init__(self, argument: str | None = None):
        self.argument = argument

    def attach(self, target: DraftTarget) -> None:
        """Called once before `begin` with what the engine offers a draft source (DraftTarget): the model's config
        and, when the engine was opened with a draft trunk, its draft model. A source that needs something the
        engine lacks refuses here (a UsageError saying how to open it)."""

    @classmethod
    def reserve(cls, memory_bytes: int) -> None:
        """Keep what this source learns across generations within `memory_bytes` (--draft-memory), from now on."""

    @classmethod
    def example_argument(cls, directory) -> str | None:
        """An argument the conformance kit can build this source with, using files it may write under
        `directory` (a Path); None when it takes no argument."""
        return None

    def check(self, vocab_size: int) -> None:
        """Refuse, before anything is generated, an argument this model cannot use (a UsageError naming it): an id
        past the vocabulary of `vocab_size` ids would otherwise stop a generation mid-stream."""

    def begin(self, prompt: Sequence[int]) -> None:
        """A generation starts after `prompt`."""

    def end(self, history: Sequence[int]) -> None:
        """The generation ended; `history` is its prompt and the ids it kept (a source that learns across
        generations records them here)."""

    @abstractmethod
    def propose(self, history: Sequence[int], generated: int, k: int) -> list[int]:
        """Up to `k` ids to follow `history` (prompt + the `generated` ids emitted so far); fewer, or none,
        when there is nothing worth proposing."""

    def see_hidden(self, layer: int, position: int, rows: np.ndarray) -> None:
        """For a source that lists `hidden_layers` (a trained draft head: EAGLE-style heads read a few of the model's
        hidden states): the model's hidden state after `layer` at positions position … position + n − 1 of this
        generation's sequence, float32 [n, H] — the residual stream's plain sum (the embedding plus every layer's
        output so far), from every pass that forwards ids: the prompt's chunks and each verify pass, whose rows
        include drafts it then rejects (the next propose's history says which ids were kept). Positions the decode
        state already held (a kept conversation, a prompt cache hit) are not replayed. The array is the engine's and
        valid during the call only: copy what you keep. Never called for a source that lists no layers."""

    def proposal_cost(self, k: int) -> tuple[float, float]:
        """(weight bytes touched in RAM, bytes read from disk) of proposing `k` ids: what `--speculate auto` charges a
        draft beside the verify pass it fills. (0, 0) for a lookup; a draft model's forwards cost their weights."""
        return 0.0, 0.0

    def state_ids(self) -> Sequence[int] | None:
        """The ids a source that keeps a decode state holds (after propose: the history it was given, or a prefix of
        it, then its own drafts); None for a source without one. The conformance kit checks a state follows the
        accepted ids: one that kept a rejected draft would drift from the text it drafts for."""
        return None


@dataclass(frozen=True)
class DraftTarget:
    """What the engine offers a draft source (DraftSource.attach): the model's `config`; `embed` and `head_logits`, the
    model's own embedding and output head (what a trained draft head shares with it); and `draft_model`, the model run
    on a draft trunk (`k3 pack --draft`, opened with --draft-trunk) with fewer routed experts per token, or None. It is
    used as the engine is: `new_state()`, `forward(ids, state, all_logits=False)` → logits, `mark(state)` and
    `rollback(state, kept)` (keep the first `kept` ids forwarded since the mark), `prefill_chunk` (ids per forward, at
    most), `forward_cost()` (bytes touched and read per id forwarded, for DraftSource.proposal_cost); and it keeps
    states between generations for the sources that run on it: `take_state(prompt)` gives the kept state holding the
    longest strict prefix of `prompt` (or a fresh one), `keep_state(state)` gives one back (a state must hold a strict
    prefix of the history it was given, without a mark)."""

    config: Config
    draft_model: Any = None
    embed: Any = None        # ids -> the model's embedding rows, float32 [T, H]
    head_logits: Any = None  # hidden rows float32 [T, H] -> the model's final norm and lm_head: logits [T, V]
