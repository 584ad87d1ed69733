"""Id generation, the lower of the two generation layers: `generate_ids` forwards a prompt into a decode
state and yields (id, logits) one step at a time, picking each id with the sampler it is given and
telling the observers it is given. It knows no text: detokenising, stop strings and chat channels are
the text layer's (session.py), stop ids and limits the caller's (stop iterating).

The decode state reuse rule (MODEL.md §4.5) lives here: `state` must hold a prefix of `prompt`; only the
rest is forwarded, in chunks of at most `engine.prefill_chunk` ids (the bits do not depend on the
chunking; the working memory does). An id is forwarded only when the next one is asked for, so after
the caller stops, `state` holds every id but the last one yielded. Prompt and generated ids together
never exceed `engine.max_context`: a longer prompt is refused, and generation ends there.

Speculative decoding (`speculation=`) changes how many passes that takes, never an id: each verify pass
forwards the last id and up to k drafted ones; the sampler picks position by position, exactly as serial
decoding would (one pick, and with sampling one PRNG draw, per emitted id, from the same logits bits), and
the first id that differs from the draft ends the step. The decode state is then rolled back to the
accepted position, so the state rule above holds after every yield.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Generator, Sequence

import numpy as np

from ..errors import InputError, PluginError, UsageError
from ..interfaces import DraftSource
from ..plan.engine_config import MAX_SPECULATE
from ..model.observer import Observer
from ..model.pass_cost import READ_WEIGHT, PassCost
from .sampling import Sampler

if TYPE_CHECKING:
    from ..model.engine import DecodeState, Engine

AUTO_K = 8          # the most ids an adaptive K (--speculate auto) drafts per pass
AUTO_REST_MAX = 64  # steps an adaptive K rests at zero drafts, at most, between tries
PROBE_SHARE = 0.02  # fruitless one-id tries cost at most this share of the passes they rest between, while they can
PRIOR_ACCEPTED, PRIOR_REJECTED = 0.25, 0.75  # an adaptive K presumes 1 in 4 drafts accepted, weighed as one draft


@dataclass(frozen=True)
class Speculation:
    """Speculative decoding for one generation: `draft` proposes ids, and each verify pass forwards the
    last id plus up to `k` of them. `adaptive` (--speculate auto) lets the number drafted move between 0 and
    `k` by the expected bytes per emitted id (DraftLength), so a draft source that is always wrong costs almost
    nothing. With `alternatives`, each pass drafts with whichever source promises the fewest bytes per emitted id
    (Drafting); an alternative the engine cannot run (`self` without a draft trunk) refuses at attach and is left
    out."""

    draft: DraftSource
    k: int = 4
    adaptive: bool = False
    alternatives: tuple[DraftSource, ...] = ()  # more sources to choose from each pass (Drafting); --draft auto

    def __post_init__(self) -> None:
        for d in (self.draft, *self.alternatives):
            if not isinstance(d, DraftSource):
                raise UsageError(f"speculation needs DraftSource instances (k3core.plugin_api.DraftSource), got "
                                 f"{type(d).__name__}")
        if not (isinstance(self.k, int) and not isinstance(self.k, bool) and 1 <= self.k <= MAX_SPECULATE):
            raise UsageError(f"speculate must be an integer in 1..{MAX_SPECULATE} drafted ids per pass, got {self.k!r}")


class DraftLength:
    """How many ids to draft for the next pass. Fixed: always k. Adaptive (--speculate auto): the length n that
    minimises the expected weight bytes per emitted id. A pass of 1 + n rows costs `cost.bytes(1 + n)` (the trunk once,
    the experts of its rows' union: model/pass_cost.py) plus what proposing n ids costs the draft source
    (DraftSource.proposal_cost: nothing for a lookup, a draft model's n forwards for `self`) and emits 1 + Σ_{j≤n}
    Π_{i≤j} p_i ids, p_i being the share of passes that reached drafted position i and had it accepted (position 1's
    prior Beta(PRIOR_ACCEPTED, PRIOR_REJECTED): a source is presumed weak until it shows otherwise; position i's prior
    is that strength around position i − 1's estimate, so a source accepted at 1 is tried at 2 before it is ever
    reached). When no length beats none, it drafts one id to keep measuring, resting 1, 2, 4 … AUTO_REST_MAX steps
    between such tries while they fail, and at least long enough that they cost PROBE_SHARE of the passes."""

    def __init__(self, k: int, adaptive: bool, cost: PassCost | None = None, draft: DraftSource | None = None) -> None:
        if adaptive and cost is None:
            raise UsageError("an adaptive draft length needs the pass cost (k3core.model.pass_cost.PassCost)")
        self.limit, self.adaptive, self.cost, self.draft = k, adaptive, cost, draft
        self.reached, self.accepted = [0] * (k + 1), [0] * (k + 1)
        self.rest = self.misses = 0

    def next(self) -> int:
        if not self.adaptive:
            return self.limit
        if self.rest:
            self.rest -= 1
            return 0
        return max(1, self.best())

    def best(self) -> int:
        """The draft length with the fewest expected bytes per emitted id under the acceptance measured so far."""
        costs = self.per_id()
        return min(range(len(costs)), key=lambda n: (costs[n], n))

    def per_id(self) -> list[float]:
        """Expected weight bytes per emitted id when drafting n = 0 … k ids, under the acceptance measured so far."""
        out, tokens, chance = [self.cost.bytes(1)], 1.0, 1.0
        weight = PRIOR_ACCEPTED + PRIOR_REJECTED
        p = PRIOR_ACCEPTED / weight
        for n in range(1, self.limit + 1):
            p = (self.accepted[n] + weight * p) / (self.reached[n] + weight)  # an untried position: the one before's
            chance *= p
            tokens += chance
            out.append((self.cost.bytes(1 + n) + self.drafting(n)) / tokens)
        return out

    def drafting(self, n: int) -> float:
        """What proposing n ids costs the draft source, weighed as a pass is (PassCost.bytes)."""
        if self.draft is None:
            return 0.0
        touched, read = self.draft.proposal_cost(n)
        return touched + READ_WEIGHT * read

    def update(self, drafted: int, accepted: int) -> None:
        if not self.adaptive:
            return
        for i in range(1, min(drafted, accepted + 1) + 1):  # position i was checked when all before it were accepted
            self.reached[i] += 1
            self.accepted[i] += i <= accepted
        if accepted or self.best() > 0:
            self.misses = 0
        else:
            self.misses += 1
            extra = (self.cost.bytes(2) + self.drafting(1)) / self.cost.bytes(1) - 1  # a fruitless try, in passes
            self.rest = min(AUTO_REST_MAX, max(2 ** (self.misses - 1), math.ceil(extra / PROBE_SHARE)))


class Drafting:
    """A speculation's draft sources at work in one generation, each with its own DraftLength (its acceptance measured
    as it runs). With one source: its ids, as many as its length says. With several (Speculation.alternatives, --draft
    auto): each pass asks every source that is not resting for its length n; a source that costs nothing to ask (a
    lookup: proposal_cost (0, 0)) proposes at once, and is scored by the ids it actually proposed; a draft model is
    scored by n, and runs only when chosen. The source with the fewest expected weight bytes per emitted id
    (DraftLength.per_id, its own cost included) drafts; only its length learns from the verify. A source left unchosen
    keeps its estimate; one whose state falls behind (self) forwards what it missed when next chosen."""

    def __init__(self, engine: Engine, spec: Speculation) -> None:
        self.sources = [spec.draft] + [d for d in spec.alternatives if attached(engine, d)]
        cost = PassCost.of(engine) if spec.adaptive or len(self.sources) > 1 else None
        self.lengths = [DraftLength(spec.k, spec.adaptive, cost, d) for d in self.sources]
        self.vocab, self.chosen = engine.config.vocab_size, 0

    def begin(self, history: Sequence[int]) -> None:
        for d in self.sources:
            d.begin(tuple(history))

    def end(self, history: Sequence[int]) -> None:
        for d in self.sources:
            d.end(tuple(history))

    def propose(self, history: Sequence[int], generated: int, room: int, sampler: Sampler) -> list[int]:
        """The ids to verify after the last one (at most `room`), as the sampler lets them stand."""
        if len(self.sources) == 1:
            k = min(self.lengths[0].next(), room)
            return sampler.drafts(proposals(self.sources[0], history, generated, k, self.vocab), k) if k > 0 else []
        best = None
        for i, (draft, length) in enumerate(zip(self.sources, self.lengths)):
            n = min(length.next(), room)
            if n <= 0:
                continue
            ids = sampler.drafts(proposals(draft, history, generated, n, self.vocab), n) \
                if draft.proposal_cost(n) == (0.0, 0.0) else None
            if ids is not None and not ids:
                continue
            score = length.per_id()[n if ids is None else len(ids)]
            if best is None or score < best[0]:
                best = (score, i, n, ids)
        if best is None:
            return []
        _, self.chosen, n, ids = best
        if ids is None:
            ids = sampler.drafts(proposals(self.sources[self.chosen], history, generated, n, self.vocab), n)
        return ids

    def update(self, drafted: int, accepted: int) -> None:
        self.lengths[self.chosen].update(drafted, accepted)


def attached(engine: Engine, draft: DraftSource) -> bool:
    """Whether an alternative source can run on this engine (DraftSource.attach does not refuse it)."""
    try:
        draft.attach(engine.draft_target())
    except UsageError:
        return False
    return True


def generate_ids(engine: Engine, prompt: Sequence[int], state: DecodeState, sampler: Sampler | None = None, *,
                 observers: Sequence[Observer] = (), full_recompute: bool = False,
                 speculation: Speculation | None = None, checkpoints: Sequence[int] = (),
                 on_checkpoint: Callable[[DecodeState, int], object] | None = None
                 ) -> Generator[tuple[int, np.ndarray], None, None]:
    """Yield (id, logits [V]) for each generated position, forever (the caller stops, then closes the
    generator: with speculation, closing is what rolls the state back to the stopping point).

    `state` holds a prefix of `prompt` (an empty state holds the empty prefix). `sampler` picks from the
    logits and the ids so far (its repetition penalty's history); None is greedy. `full_recompute`
    forwards the whole sequence from a fresh state for every id (a check of the incremental path; `state`
    is then left as it was). `speculation` verifies drafted ids in batched passes (same ids). `on_checkpoint(state,
    position)` is called for each prompt position of `checkpoints` as the prompt is forwarded, the state's arrays
    there kept (`prefill`): what a prompt cache keeps."""
    history = checked_prompt(engine, prompt, state)
    done = state.ids
    if speculation is not None:
        check_speculation(engine, speculation, full_recompute)
    sampler = sampler or Sampler()
    if full_recompute:
        while True:
            logits = engine.forward(history, engine.new_state(), observers=observers)
            token = pick(sampler, logits, history, observers)
            yield token, logits
            history.append(token)
            if len(history) >= engine.max_context:
                return
    if speculation is not None and (speculation.adaptive or speculation.alternatives):  # the passes teach the pass
        observers = [*observers, PassCost.of(engine)]                                    # cost what they read
    if speculation is not None:
        observers = with_hidden(observers, {0: sources(speculation)})
    logits = prefill(engine, history[len(done):], state, observers, checkpoints, on_checkpoint)
    if speculation is not None:
        yield from speculative(engine, history, state, sampler, logits, speculation, observers)
        return
    while True:
        token = pick(sampler, logits, history, observers)
        yield token, logits
        history.append(token)
        if len(history) >= engine.max_context:  # the context is full: this id can never be forwarded
            return
        logits = engine.forward([token], state, observers=observers)


def checked_prompt(engine: Engine, prompt: Sequence[int], state: DecodeState) -> list[int]:
    """`prompt` as a list of ints, refused if empty, over the context limit, or not extending `state`."""
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
    return history


def pick(sampler: Sampler, logits: np.ndarray, history: Sequence[int], observers: Sequence[Observer]) -> int:
    token = sampler.pick(logits, history)
    for o in observers:
        o.on_token(token, logits)
    return token


class HiddenFeed(Observer):
    """An Observer handing draft sources the hidden states they list (DraftSource.hidden_layers): `drafts` maps a
    sequence's index in the pass to its source."""

    def __init__(self, drafts: dict[int, Sequence[DraftSource]]) -> None:
        self.drafts = {i: [d for d in ds if d.hidden_layers] for i, ds in drafts.items()}
        self.hidden_layers = tuple(sorted({L for ds in self.drafts.values() for d in ds for L in d.hidden_layers}))

    def on_hidden(self, layer: int, hidden: np.ndarray, spans) -> None:
        for i, drafts in self.drafts.items():
            first, end, position = spans[i]
            for draft in drafts:
                if layer in draft.hidden_layers:
                    draft.see_hidden(layer, position, hidden[first:end])


def sources(spec: Speculation) -> list[DraftSource]:
    return [spec.draft, *spec.alternatives]


def with_hidden(observers: Sequence[Observer], drafts: dict[int, Sequence[DraftSource]]) -> list:
    """`observers`, and a HiddenFeed when a draft source reads hidden states (`drafts`: a pass's sequence index ->
    its sources)."""
    feed = HiddenFeed(drafts)
    return [*observers, feed] if feed.hidden_layers else list(observers)


def check_speculation(engine: Engine, speculation: Speculation, full_recompute: bool) -> None:
    if full_recompute:
        raise UsageError("speculation and full recompute do not combine: full recompute forwards every id alone")
    if speculation.k > engine.speculate:
        raise UsageError(f"speculate {speculation.k}: this engine's memory plan reserves rollback for "
                         f"{engine.speculate} drafted ids per pass (EngineConfig.speculate, --speculate when opening)")
    speculation.draft.attach(engine.draft_target())
    speculation.draft.check(engine.config.vocab_size)
    layers = engine.config.num_hidden_layers
    for draft in sources(speculation):
        if bad := [L for L in draft.hidden_layers if not (isinstance(L, int) and 0 <= L < layers)]:
            raise PluginError(f"draft source {draft.name!r}: hidden_layers {bad!r} are not layers of this model "
                              f"(0..{layers - 1})")


def speculative(engine: Engine, history: list[int], state: DecodeState, sampler: Sampler, logits: np.ndarray,
                spec: Speculation, observers: Sequence[Observer]) -> Generator[tuple[int, np.ndarray], None, None]:
    """generate_ids after the prompt, with verify passes; `logits` are the prompt's last position's."""
    drafting = Drafting(engine, spec)
    drafting.begin(history)
    drafted: list[int]
    rows, drafted, generated, kept, agreed = logits[None], [], 0, 0, 0
    try:
        while True:
            i = 0
            while True:  # emit from the pass's rows while the model agrees with the draft
                token = pick(sampler, rows[i], history, observers)
                kept = i + 1  # stopped after this id, the state keeps the pass's positions before it
                agreed = i + (i < len(drafted) and token == drafted[i])
                yield token, rows[i]
                history.append(token)
                generated += 1
                if len(history) >= engine.max_context:
                    return
                if agreed == i:
                    break
                i += 1
            if drafted:  # i drafted ids were accepted: keep [last id, those i]
                engine.rollback(state, i + 1)
                drafting.update(len(drafted), i)
                tell_draft(observers, drafted, i)
            drafted = drafting.propose(history, generated, engine.max_context - 1 - len(history), sampler)
            if drafted:
                engine.mark(state)
            kept = agreed = 0
            rows = engine.forward([history[-1], *drafted], state, all_logits=True, observers=observers)
    finally:
        if state.mark is not None:  # stopped inside a verify pass's ids
            engine.rollback(state, kept)
            tell_draft(observers, drafted, agreed)
        drafting.end(history)


def tell_draft(observers: Sequence[Observer], drafted: Sequence[int], accepted: int) -> None:
    for o in observers:
        o.on_draft(len(drafted), accepted)


def proposals(draft: DraftSource, history: Sequence[int], generated: int, k: int, vocab: int) -> list[int]:
    """The draft source's ids for the next pass, checked: at most k token ids of this model."""
    ids = draft.propose(tuple(history), generated, k)
    try:
        ids = list(ids)
    except TypeError:
        raise PluginError(f"draft source {draft.name!r}: propose() returned {type(ids).__name__}, not a list of "
                          "token ids") from None
    bad = [t for t in ids if not (isinstance(t, (int, np.integer)) and not isinstance(t, bool) and 0 <= t < vocab)]
    if bad or len(ids) > k:
        raise PluginError(f"draft source {draft.name!r}: propose() must return at most {k} token ids in 0..{vocab - 1}"
                          f", got {len(ids)} ids" + (f" including {bad[:3]!r}" if bad else ""))
    return [int(t) for t in ids]


def prefill(engine: Engine, ids: Sequence[int], state: DecodeState, observers: Sequence[Observer] = (),
            checkpoints: Sequence[int] = (), on_checkpoint: Callable[[DecodeState, int], object] | None = None
            ) -> np.ndarray:
    """Forward `ids` in chunks of `engine.prefill_chunk`; the logits of the last position. At each position of
    `checkpoints` (counting every id the state holds) the pass keeps the state (Engine keep_at, without cutting the
    chunk there) and `on_checkpoint(state, position)` is called after it."""
    step, start = engine.prefill_chunk, len(state.ids)
    wanted = sorted({p for p in checkpoints if start < p < start + len(ids)} if on_checkpoint else set())
    for at in range(0, len(ids), step):
        inside = [p for p in wanted if start + at < p <= start + at + step]
        logits = engine.forward(ids[at:at + step], state, observers=observers, keep_at=inside)
        for p in inside:
            on_checkpoint(state, p)
    return logits


def greedy_ids(engine: Engine, prompt: Sequence[int], n: int, full_recompute: bool = False
               ) -> tuple[list[int], np.ndarray]:
    """Greedy decode of `n` ids from a fresh state: (ids, logits [n, V] float32)."""
    ids, rows = [], []
    for token, logits in generate_ids(engine, prompt, engine.new_state(), full_recompute=full_recompute):
        ids.append(token)
        rows.append(logits)
        if len(ids) == n:
            break
    return ids, np.array(rows, dtype=np.float32).reshape(n, engine.config.vocab_size)
