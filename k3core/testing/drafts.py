"""Conformance checks of a draft source (speculative decoding): it is a DraftSource subclass, what it proposes is
well-formed, a decode state it keeps (DraftSource.state_ids) follows the history it is given, and generating with it
gives exactly the serial ids, logits and decode state — greedy and seeded sampling, fixed K and adaptive, on
generated models. A source that runs the engine's draft model (uses_draft_model) gets engines opened on a packed
trunk with an int8 draft of it. Proposals may be as wrong as they like; only time may change."""
from __future__ import annotations

from ..interfaces import DraftSource
from ..model.engine import Engine
from ..plan.engine_config import EngineConfig
from ..testmodel.make import shape_config
from ..generation.generate import AUTO_K, Speculation
from ..generation.sampling import SamplingParams
from . import models
from .checks import Check, CheckFailed, expect
from .engines import generation

PROMPTS = ((3, 1, 4, 1, 5, 9, 2, 6), (7, 7, 8, 7, 7, 8, 7, 7))  # the second repeats, so lookup drafts fire
STEPS = 12
PARAMS = (("greedy", SamplingParams()), ("seeded sampling", SamplingParams(temperature=0.9, top_k=40, seed=5)))


def engine_for(cls, shape: str) -> Engine:
    """An engine of the `shape` test model that speculates up to AUTO_K ids; for a source that runs the draft model,
    opened on its packed trunk with an int8 draft of it."""
    drafted = dict(trunk=models.packed_trunk(shape), draft_trunk=models.draft_trunk(shape)) \
        if getattr(cls, "uses_draft_model", False) else {}
    return Engine(EngineConfig(models.model(shape), speculate=AUTO_K, **drafted), available=1 << 40)


def draft_checks(cls) -> list[Check]:
    """Every check of the draft source class `cls` (built as cls(cls.example_argument(directory)))."""
    who = f"draft source {getattr(cls, 'name', cls)!r}"

    def build():
        return cls(cls.example_argument(models.scratch(f"draft-{cls.name}")))

    def proposals_are_token_ids():
        if not (isinstance(cls, type) and issubclass(cls, DraftSource)):
            raise CheckFailed(f"{cls!r} is not a DraftSource subclass, and speculation refuses anything else: declare "
                              f"it `class {getattr(cls, '__name__', 'MyDraft')}(DraftSource)` with `from "
                              "k3core.plugin_api import DraftSource`")
        draft, vocab = build(), shape_config("tiny").vocab_size
        engine = engine_for(cls, "tiny")
        try:
            try:  # speculation calls them first: the engine's offer and the kit's own argument must pass
                draft.attach(engine.draft_target())
                draft.check(vocab)
            except Exception as exc:
                raise CheckFailed(f"attach() or check(vocab_size={vocab}) refused the kit's engine or the example "
                                  f"argument {cls.example_argument.__qualname__} gave: {exc}") from None
            for prompt in PROMPTS:
                draft.begin(prompt)
                history = list(prompt)
                for generated in range(6):
                    for k in (1, 3, 8):
                        ids = list(draft.propose(tuple(history), generated, k))
                        expect(len(ids) <= k, f"propose(k={k}) returned {len(ids)} ids")
                        expect(all(isinstance(t, int) and 0 <= t < vocab for t in ids),
                               f"propose returned {ids[:5]!r}: not token ids (ints in 0..{vocab - 1} on this model)")
                        follows_history(draft, history, ids)
                        cost = draft.proposal_cost(k)
                        expect(isinstance(cost, tuple) and len(cost) == 2 and all(
                            isinstance(c, (int, float)) and not isinstance(c, bool) and 0 <= c < float("inf")
                            for c in cost), f"proposal_cost({k}) returned {cost!r}: (bytes touched, bytes read), "
                            "finite numbers >= 0")
                    history.append((generated * 37) % vocab)
                draft.end(tuple(history))
        finally:
            engine.close()

    def speculation_gives_serial_output():
        for shape in ("tiny", "small"):
            engine = engine_for(cls, shape)
            try:
                for prompt in PROMPTS:
                    for how, params in PARAMS:
                        want = generation(engine, prompt, STEPS, params)
                        for k, adaptive in ((4, False), (AUTO_K, True)):
                            got = generation(engine, prompt, STEPS, params, Speculation(build(), k, adaptive))
                            what = f"{shape} model, {how}, {'auto' if adaptive else f'K={k}'}, prompt {list(prompt)}"
                            if got[0] != want[0]:
                                raise CheckFailed(f"{what}: ids {got[0]} instead of serial {want[0]}")
                            expect(got[1] == want[1], f"{what}: the logit bytes differ from serial decoding")
                            expect(got[2] == want[2], f"{what}: the decode state after stopping differs from serial")
            finally:
                engine.close()

    return [Check(f"{who}: a DraftSource subclass that proposes at most k token ids of the model (a state it "
                  "keeps follows the history)", proposals_are_token_ids),
            Check(f"{who}: speculation with it gives the serial ids, logit bytes and decode state (greedy, seeded "
                  "sampling; K=4 and auto)", speculation_gives_serial_output)]


def follows_history(draft, history: list[int], proposed: list[int]) -> None:
    """A source with a decode state holds, after proposing, a prefix of the history it was given followed by nothing
    but its own proposals: never an id the history does not have (a rejected draft kept is a state that drifts)."""
    held = draft.state_ids()
    if held is None:
        return
    held = list(held)
    n = min(len(held), len(history))
    if held[:n] != history[:n]:
        at = next(i for i in range(n) if held[i] != history[i])
        raise CheckFailed(f"after propose its state holds {len(held)} ids that leave the history at position {at}: "
                          "it drifted (a rejected draft kept?)")
    expect(held[n:] == proposed[:len(held) - n], f"after propose its state holds ids past the history that it did not "
                                                 f"propose: {held[n:][:5]!r}, proposed {proposed[:5]!r}")
