"""The `self` draft source: K3 proposes for itself. The engine's draft model (DraftTarget.draft_model: the model run on
a draft trunk that `k3 pack --draft int8|int4` derived, with fewer routed experts per token; opened with
--draft-trunk) continues the history greedily, one id per forward, and the exact model verifies what it proposes.

Its decode state follows the history exactly. Before each proposal it is synced: the ids forwarded since its mark (the
last id and the drafts of the previous proposal) are rolled back to those the history kept, the rest of the history
is forwarded, and a new mark is set before the last id, so nothing the verify pass rejected stays in it. Across
generations the draft model keeps the states (take_state / keep_state), so a conversation's next turn forwards only
its new ids. A proposal never decides an id: a wrong one costs a verify pass its length, nothing more.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..plugin_api import DraftSource, UsageError, hookimpl


class SelfDraft(DraftSource):
    name = "self"
    description = ("the model itself on a quantized draft trunk with fewer routed experts (--draft-trunk; "
                   "k3 pack --draft int8 derives one)")
    uses_draft_model = True

    def __init__(self, argument=None):
        super().__init__(argument)
        if argument is not None:
            raise UsageError(f"--draft self takes no argument (its experts per token are --draft-topk), got "
                             f"self:{argument}")
        self.model = self.state = None

    def attach(self, target):
        if target.draft_model is None:
            raise UsageError("--draft self runs the model on a draft trunk, and this engine has none: open it with "
                             "--draft-trunk int8 (EngineConfig.draft_trunk) after `k3 pack MODEL_DIR TRUNK_DIR "
                             "--draft int8` derived one from the packed trunk")
        if self.state is not None and target.draft_model is not self.model:
            raise UsageError("this `self` draft source is attached to another engine's draft model: build one per "
                             "generation")
        self.model = target.draft_model

    def begin(self, prompt):
        if self.model is None:
            raise UsageError("the `self` draft source proposes with an engine's draft model: speculation attaches it "
                             "(DraftSource.attach) before begin")
        if self.state is not None:  # begun again without an end: the last generation's state goes back first
            self.end(prompt)
        self.state = self.model.take_state(prompt)

    def propose(self, history, generated, k):
        if self.state is None:
            raise UsageError("propose before begin: the `self` draft source has no decode state yet")
        history = list(history)
        self.state = state = self._synced(self.state, history)
        model = self.model
        tail = history[len(state.ids):]
        for at in range(0, len(tail) - 1, model.prefill_chunk):  # the history up to its last id, unmarked
            model.forward(tail[at:min(at + model.prefill_chunk, len(tail) - 1)], state)
        model.mark(state)
        logits, drafts = model.forward(tail[-1:], state), []
        while len(drafts) < k:
            drafts.append(int(np.argmax(logits)))
            if len(drafts) < k:
                logits = model.forward(drafts[-1:], state)
        return drafts

    def proposal_cost(self, k):
        if self.model is None:
            return 0.0, 0.0
        touched, read = self.model.forward_cost()
        return k * touched, k * read  # k forwards of one id: the last one and k - 1 drafts

    def end(self, history):
        if self.state is not None:
            self.model.keep_state(self._settled(self.state, list(history)))
            self.state = None

    def state_ids(self):
        return None if self.state is None else list(self.state.ids)

    def _synced(self, state, history: list[int]):
        """`state` settled on `history` and holding a strict prefix of it; else a fresh state."""
        state = self._settled(state, history)
        if len(state.ids) >= len(history) or history[:len(state.ids)] != state.ids:
            return self.model.new_state()
        return state

    def _settled(self, state, history: Sequence[int]):
        """`state` without its mark: what it forwarded since rolled back to the ids `history` kept (at most all but
        its last id); a fresh state when `history` left it before the mark."""
        if state.mark is None:
            return state
        kept = min(common_prefix(state.ids, history), len(history) - 1) - state.mark
        if kept < 0:
            return self.model.new_state()
        self.model.rollback(state, kept)
        return state


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids `a` and `b` share."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n], np.int64) != np.asarray(b[:n], np.int64))
    return int(diff[0]) if len(diff) else n


@hookimpl(trylast=True)
def k3_draft_sources():
    return [SelfDraft]
