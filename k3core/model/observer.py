"""The Observer: what watches forward passes and generations. The engine, the latent MoE and the generation loops
call it; it lives apart from all of them so that each reads it without reading the others.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


class Observer:
    """Watches forward passes and generations. Override what you need; the defaults do nothing.

    Passed as an argument (`Engine.forward(..., observers=[o])`, `generate_ids`, `Session.generate`,
    `ChatSession.ask`), called on the thread that runs the pass. An exception raised here stops the
    pass; the decode state it was advancing must then be treated as spent."""

    def on_layer(self, layer: int, layers: int) -> None:
        """A forward pass starts layer `layer` of `layers` (layer 0 starts a new pass)."""

    def on_route(self, layer: int, expert_ids: np.ndarray) -> None:
        """Layer `layer` routed its tokens: expert ids int64 [T, k] in rank order."""

    def on_token(self, token: int, logits: np.ndarray) -> None:
        """A generation picked `token` from `logits` [V] (float32)."""

    def on_draft(self, drafted: int, accepted: int) -> None:
        """A speculative verify pass checked `drafted` drafted ids and the model agreed with the first `accepted`."""

    hidden_layers: tuple[int, ...] = ()  # the layers whose hidden states on_hidden is given (none: never called)

    def on_hidden(self, layer: int, hidden: np.ndarray, spans: Sequence[tuple[int, int, int]]) -> None:
        """Layer `layer` (one of `hidden_layers`) is done: `hidden` float32 [T, H] is the residual stream's plain sum
        after it (the embedding plus every layer's output so far: the attention-residual blocks and the partial sum,
        added in order) for every row of the pass; `spans` gives each sequence's rows as (first row, end row, the
        position of its first row in its sequence). The engine's array, valid during the call: copy what you keep."""
