"""The search: coordinate descent from the untuned settings, one knob at a time in the order given, each value
measured with the best of the others so far; a value is taken only when it beats the best by more than the noise
margin on what its knob moves — its phase (PHASES): the reply's seconds per token, or, for the knobs that shape
only the prompt's pass, the prompt's seconds; for the knobs that trade the reply against the prompt (the prompt
cache's RAM, taken from the expert cache's), a conversation's turns, prompt and reply. A trial is measured in one
phase: a decode trial resumes its prompts from the states the first trial kept (trial.py: no prompt is forwarded
again), a prefill trial forwards them, a turn trial sends them as one conversation; scores are compared within a
phase only. The knobs of each phase are turned in turn, then the untuned
settings and the winner are measured once more in that phase, one after the other, and the winner is kept only if
it still wins there. Bounded in time: a trial that would end past the deadline is not started.

Every trial must give the first trial's ids (a turn trial: the first turn trial's); one that does not aborts the
search naming its setting
(UnsoundRunError, exit 4): a setting that changes ids is a bug in k3 or a plugin, never a choice.

Nothing here runs a model: `measure(setting)` does (tune/trial.py), so the search is tested on its own.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

from ..errors import PlanError, UnsoundRunError
from .knobs import Knob, describe

NOISE = 0.03  # a value must be this much faster than the best so far to replace it
# what a phase is judged by: a figure every trial reports (trial.py); "turn": a conversation's turns sent whole
PHASES = {"decode": "seconds_per_token", "prefill": "prefill_seconds", "turn": "turn_seconds"}


@dataclass(frozen=True)
class Trial:
    """One measured setting: its seconds for the whole workload, or why it did not run."""

    setting: Mapping               # knob name -> value
    seconds: float | None = None   # wall time of the workload (None: did not run)
    ids: tuple = ()                # the ids every prompt gave, in order
    figures: Mapping = field(default_factory=dict)  # decode s/token, prefill ids/s, peak RSS, … (as measured)
    skipped: str | None = None     # why it did not run ("does not fit: …")
    took: float = 0.0              # wall seconds the trial cost, start-up included
    knob: str | None = None        # the knob this trial turned (None: the start, a confirmation, a grid point)
    phase: str = "prefill"         # "decode": its prompts resumed from kept states; "prefill": forwarded; "turn":
                                   # the prompts as one conversation's turns (another workload: its own ids)

    def score(self, phase: str) -> float | None:
        """What `phase` judges, when this trial measured it (a decode trial's prompts were not forwarded; a
        conversation is another workload)."""
        if self.seconds is None or phase != self.phase and not (phase, self.phase) == ("decode", "prefill"):
            return None
        return self.figures.get(PHASES[phase])

    def beats(self, other: "Trial", phase: str, margin: float = NOISE) -> bool:
        mine, theirs = self.score(phase), other.score(phase)
        return mine is not None and theirs is not None and mine < theirs * (1 - margin)


@dataclass
class Outcome:
    start: Mapping                 # the untuned setting
    best: Mapping                  # the winner (the start when nothing beat it)
    trials: list[Trial]
    confirm: list[Trial] = field(default_factory=list)  # the start and the winner measured again, per phase
    not_tried: list[str] = field(default_factory=list)  # "knob=value: why"
    complete: bool = True          # False: the deadline or Ctrl-C cut it short

    def of(self, setting: Mapping, phase: str, confirm: bool | None = None) -> list[float]:
        """The scores of every trial of `setting` measured in `phase` (only the confirming ones, or none of them)."""
        pool = self.confirm if confirm else self.trials if confirm is False else self.trials + self.confirm
        return [t.score(phase) for t in pool if t.setting == setting and t.phase == phase
                and t.score(phase) is not None]

    def mean(self, setting: Mapping, phase: str) -> float | None:
        scores = self.of(setting, phase)
        return sum(scores) / len(scores) if scores else None

    def gain(self, phase: str = "decode") -> float | None:
        """Untuned ÷ tuned score in `phase`: from the phase's confirming pair when there is one, else the means
        (None where the winner was never measured in that phase)."""
        start, best = self.of(self.start, phase, confirm=True), self.of(self.best, phase, confirm=True)
        start, best = (start[-1], best[-1]) if start and best else (self.mean(self.start, phase),
                                                                    self.mean(self.best, phase))
        return start / best if start and best else None


def _key(setting: Mapping) -> tuple:
    return tuple(sorted(setting.items()))


class Search:
    """Runs trials through `measure(setting, phase)`, checking ids and the clock; `on_trial` sees each as it
    lands."""

    def __init__(self, measure: Callable[[Mapping, str], Trial], deadline: float,
                 on_trial: Callable[[Trial, Trial | None, Mapping], object] = lambda trial, best, start: None,
                 clock: Callable[[], float] = time.monotonic):
        self.measure, self.deadline, self.on_trial, self.clock = measure, deadline, on_trial, clock
        self.reference: dict[bool, Trial] = {}  # the first trial of each workload (a conversation or not)
        self.outcome: Outcome | None = None

    def _time_left_for(self, outcome: Outcome, spare: int = 0) -> bool:
        """Whether one more trial (and `spare` after it) fits before the deadline, at the trials' mean cost."""
        done = [t.took for t in outcome.trials + outcome.confirm]
        took = sum(done) / len(done) if done else 0.0
        return self.clock() + took * (1 + spare) <= self.deadline

    def trial(self, outcome: Outcome, setting: Mapping, phase: str, best: Trial | None, into: list,
              knob: str | None = None) -> Trial:
        trial = replace(self.measure(dict(setting), phase), knob=knob, phase=phase)
        if trial.seconds is not None:
            first = self.reference.setdefault(phase == "turn", trial)
            mine, theirs, what = trial.ids, first.ids, ""
            prompts = self.reference.get(False)
            if phase == "turn" and prompts is not None and mine[:1] != prompts.ids[:1]:
                first, mine, theirs = prompts, mine[:1], prompts.ids[:1]  # a conversation's first turn: prompt 1
                what = " (the first turn of a conversation is the first prompt)"
            if mine != theirs:
                raise UnsoundRunError(
                    f"k3 tune: {describe(setting, outcome.start) or 'the untuned settings'} gave other ids than "
                    f"{describe(first.setting, outcome.start) or 'the untuned settings'}{what} "
                    f"({_first_difference(theirs, mine)}): a setting must never change an id. "
                    "This is a bug in k3 or in a plugin: please report it with this line")
        into.append(trial)
        self.on_trial(trial, best, outcome.start)
        return trial

    def descend(self, knobs: Sequence[Knob], start: Mapping, confirm: bool = True) -> Outcome:
        """Coordinate descent over `knobs` from `start` (each knob's start value in it): the decode knobs, then the
        prefill knobs. The first trial forwards the prompts (and keeps their states for the decode trials)."""
        out = self.outcome = Outcome(dict(start), dict(start), [])
        first = self.trial(out, start, "prefill", None, out.trials)
        if first.seconds is None:
            raise PlanError(f"k3 tune: the untuned settings do not run here ({first.skipped}): give a budget that fits")
        for phase in PHASES:
            turned = [k for k in knobs if k.phase == phase]
            if turned:
                self._descend_phase(out, turned, phase, first if phase == "prefill" else None, confirm)
        return out

    def _descend_phase(self, out: Outcome, knobs: Sequence[Knob], phase: str, measured: Trial | None,
                       confirm: bool) -> None:
        best = measured if measured is not None and out.best == out.start else None
        entry = dict(out.best)
        for knob in knobs:
            for value in knob.values:
                setting = {**out.best, knob.name: value}
                if value == out.best.get(knob.name) or not knob.applies(setting):
                    continue
                if not self._time_left_for(out, spare=2 if confirm else 0):
                    out.not_tried.append(f"{knob.name}={value}: --minutes reached")
                    out.complete = False
                    continue
                if best is None:  # the best so far, measured in this phase first
                    best = self.trial(out, out.best, phase, None, out.trials)
                t = self.trial(out, setting, phase, best, out.trials, knob.name)
                if t.beats(best, phase):
                    out.best, best = setting, t
        if confirm and out.best != entry:  # the untuned settings and the winner, one after the other, in this phase
            start_again = self.trial(out, out.start, phase, best, out.confirm)
            again = self.trial(out, out.best, phase, best, out.confirm)
            before = start_again if entry == out.start else self.latest(out, entry, phase)
            if not again.beats(before, phase):
                out.best = entry  # the win did not hold up: what this phase started from stays

    @staticmethod
    def latest(out: Outcome, setting: Mapping, phase: str) -> Trial:
        return next(t for t in reversed(out.trials) if t.setting == setting and t.phase == phase)

    def grid(self, knobs: Sequence[Knob], start: Mapping) -> Outcome:
        """Every combination of the knobs' values, each a decode trial after the first (a check of the descent over
        decode knobs; slow). The turn knobs are left as they start: a decode trial cannot judge them."""
        knobs = [k for k in knobs if k.phase != "turn"]
        out = self.outcome = Outcome(dict(start), dict(start), [])
        best, seen = None, set()
        for values in itertools.product(*(k.values for k in knobs)):
            setting = {**start, **{k.name: v for k, v in zip(knobs, values)}}
            setting.update({k.name: start[k.name] for k in knobs if not k.applies(setting)})
            if _key(setting) in seen:
                continue
            seen.add(_key(setting))
            if best is not None and not self._time_left_for(out):
                out.not_tried.append(f"{describe(setting, start)}: --minutes reached")
                out.complete = False
                continue
            if not out.trials:  # the first forwards the prompts and keeps their states
                self.trial(out, setting, "prefill", None, out.trials)
            t = self.trial(out, setting, "decode", best, out.trials)
            if t.seconds is not None and (best is None or t.beats(best, "decode", margin=0.0)):
                out.best, best = setting, t
        return out


def _first_difference(a: tuple, b: tuple) -> str:
    for p, (x, y) in enumerate(zip(a, b)):
        if x != y:
            diff = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
            return f"prompt {p + 1}, reply id {diff + 1}: {list(x[diff:diff + 1])} against {list(y[diff:diff + 1])}"
    return f"{len(a)} prompts against {len(b)}"
