"""Choosing the next id from logits: greedy by default, seeded sampling that is the same everywhere.

Contract. `Sampler(params).pick(logits, history)` returns one id. temperature == 0 is greedy:
argmax of the (repetition-penalised) logits, lowest id on ties, i.e. `int(np.argmax(logits))`
when no penalty is set. A Sampler given a constraint (structured.py: a JSON schema, a forced tool call)
sets the logit of every id the constraint does not allow next to -inf right after the repetition penalty
(step 1), before everything else, and tells it each id picked; masked ids are never candidates. Otherwise
the filters apply in exactly this order:

  1. repetition penalty: for each distinct id in `history`, a logit l > 0 becomes l / r and
     l <= 0 becomes l * r (r > 1 makes repeats less likely on both signs);
  2. temperature: x = l / T (float64; float32 -> float64 is exact);
  3. candidates sorted by x descending, ties by lowest id (stable argsort); weights
     w = exp(x - max x) with `det_exp`, so the top weight is exactly 1;
  4. top-k: keep the first k candidates (0 = off);
  5. top-p: keep the shortest prefix whose weight sum reaches p * (sum of the kept weights)
     (1.0 = off);
  6. min-p: keep candidates with w >= min_p, i.e. probability >= min_p * top probability (0 = off);
  7. draw: u in [0, 1) from the sampler's own PRNG; the id is the first kept candidate whose
     running sum exceeds u * total. Running sums are `np.cumsum` on float64 (strictly left to right).

Same seed -> same ids on every machine: the PRNG is splitmix64 in Python ints (one 64-bit output
per sampled id; u = (z >> 11) * 2**-53), and the probability path uses only IEEE-exact operations
(+ - * /, rint, ldexp): `det_exp` is a fixed polynomial, not libm's or numpy's SIMD exp, whose last
bits vary by machine. Greedy picks draw nothing. Stop ids and stop strings are the caller's job;
`StopMatcher` helps with the latter. Checked by tests/generation/test_sampling.py.
"""
from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from ..errors import K3Error, UsageError
from .structured import Constraint, schema_text

MASK64 = (1 << 64) - 1
_LN2_HI = 6.93147180369123816490e-01  # 0x3fe62e42fee00000: k * _LN2_HI is exact for |k| < 2**11
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e+00
_EXP_COEF = [1.0 / math.factorial(n) for n in range(14)]  # Taylor to r**13: error < 4e-18 for |r| <= ln2/2


def det_exp(x: np.ndarray) -> np.ndarray:
    """exp(x) for float64 x <= 0 (-inf allowed), within ~2 ulp, bit-identical on every IEEE machine."""
    x = np.maximum(np.asarray(x, np.float64), -1100.0)  # exp(-1100) underflows to 0 anyway
    k = np.rint(x * _INV_LN2)
    r = (x - k * _LN2_HI) - k * _LN2_LO  # |r| <= ln2 / 2
    p = np.full_like(r, _EXP_COEF[-1])
    for c in reversed(_EXP_COEF[:-1]):
        p = p * r + c  # separate ufuncs: no fused multiply-add, one rounding each
    return np.ldexp(p, k.astype(np.int64))


class SplitMix64:
    """splitmix64 (Steele, Lea, Flood 2014): state += golden gamma, then two xor-shift-multiplies."""

    def __init__(self, seed: int) -> None:
        self.state = seed & MASK64

    def next_u64(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def uniform(self) -> float:
        """A float in [0, 1) with 53 random bits."""
        return (self.next_u64() >> 11) * (1.0 / (1 << 53))


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick ids. Defaults are greedy; `seed=None` means a fresh random seed per Sampler
    (read it back from `Sampler.seed` to reproduce a run). `json_schema` holds the reply to that schema (the
    text layer compiles it against its tokenizer: Session, ChatSession). All problems are reported at once."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int = 512
    stop_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = field(default=())
    json_schema: str | None = None  # the reply is JSON satisfying this schema (a dict is kept as its JSON text)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_ids", tuple(self.stop_ids))
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
        problems = []
        if self.json_schema is not None:
            try:
                object.__setattr__(self, "json_schema", schema_text(self.json_schema))
            except UsageError as exc:
                problems.append(str(exc))
        t = self.temperature
        if not _is_num(t) or t < 0 or 0 < t < 1e-6:
            problems.append(f"temperature must be 0 (greedy) or a finite number >= 1e-6, got {t!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            problems.append(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not _is_num(self.top_p) or not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
        if not _is_num(self.min_p) or not 0 <= self.min_p < 1:
            problems.append(f"min_p must be in [0, 1) (0 = off), got {self.min_p!r}")
        if not _is_num(self.repetition_penalty) or self.repetition_penalty <= 0:
            problems.append(f"repetition_penalty must be a finite number > 0 (1 = off), got {self.repetition_penalty!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed <= MASK64):
            problems.append(f"seed must be an integer in 0..2**64-1, got {self.seed!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            problems.append(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        bad_ids = [i for i in self.stop_ids if not _is_int(i) or i < 0]
        if bad_ids:
            problems.append(f"stop_ids must be token ids (integers >= 0), got {bad_ids!r}")
        bad_strings = [s for s in self.stop_strings if not isinstance(s, str) or not s]
        if bad_strings:
            problems.append(f"stop_strings must be non-empty strings, got {bad_strings!r}")
        if problems:
            raise UsageError("bad sampling parameters:\n" + "\n".join(f"  - {p}" for p in problems))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @classmethod
    def suggested(cls, mode: str, **overrides: Any) -> "SamplingParams":
        """MODEL.md §7's suggestion: instruct temperature 0.6; thinking temperature 1.0, top-p 1.0."""
        base = {"instruct": {"temperature": 0.6}, "thinking": {"temperature": 1.0, "top_p": 1.0}}
        if mode not in base:
            raise UsageError(f"mode must be 'instruct' or 'thinking', got {mode!r}")
        return cls(**{**base[mode], **overrides})


class Sampler:
    """Picks ids under fixed SamplingParams; holds the PRNG (and the constraint's matcher), so one Sampler per
    generation. `constraint`: a structured.Constraint the picks obey, or None."""

    def __init__(self, params: SamplingParams | None = None, constraint: Constraint | None = None) -> None:
        self.params = params or SamplingParams()
        self.seed = self.params.seed if self.params.seed is not None else secrets.randbits(64)
        self.rng = SplitMix64(self.seed)
        self.constraint = constraint

    def pick(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """The next id; `history` holds the ids the repetition penalty applies to (caller's choice)."""
        x = self._checked(logits, history)
        if self.params.greedy:
            token = int(np.argmax(x))  # ties: lowest id
        else:
            ids, w = self._candidates(x)
            c = np.cumsum(w)  # float64, left to right
            u = self.rng.uniform()
            token = int(ids[min(int(np.searchsorted(c, u * c[-1], side="right")), len(ids) - 1)])
        if self.constraint is not None:
            self.constraint.advance(token)
        return token

    def drafts(self, ids: list[int], k: int) -> list[int]:
        """Drafted ids worth verifying next: all of them, or under a constraint what it allows or forces."""
        return ids if self.constraint is None else self.constraint.drafts(ids, k)

    def distribution(self, logits: np.ndarray, history: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """(ids in candidate order, their probabilities) after every filter; draws nothing.
        Greedy: the argmax alone, with probability 1."""
        x = self._checked(logits, history)
        if self.params.greedy:
            return np.array([int(np.argmax(x))]), np.array([1.0])
        ids, w = self._candidates(x)
        return ids, w / np.cumsum(w)[-1]

    def _checked(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        logits = np.asarray(logits)
        if logits.ndim != 1 or logits.size == 0:
            raise K3Error(f"the sampler needs one non-empty row of logits, got shape {logits.shape}")
        if np.isnan(logits).any() or np.isposinf(logits).any():
            raise K3Error("the sampler got NaN or +inf logits")
        r = self.params.repetition_penalty
        x = penalise(logits, history, r) if r != 1.0 and len(history) else logits
        return x if self.constraint is None else self.constraint.apply(x)

    def _candidates(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Steps 2-6: kept ids in candidate order and their unnormalised float64 weights."""
        p = self.params
        x = np.asarray(x, np.float64) / p.temperature
        order = np.argsort(-x, kind="stable")  # descending, ties by lowest id
        if x[order[0]] == -np.inf:
            raise K3Error("the sampler got only -inf logits: no id can be drawn")
        w = det_exp(x[order] - x[order[0]])  # [V] weights in candidate order, w[0] == 1
        n = int(np.count_nonzero(x > -np.inf))  # an id at -inf (masked) is never a candidate, not even at weight 0
        n = n if p.top_k == 0 else min(p.top_k, n)
        if p.top_p < 1.0:
            c = np.cumsum(w[:n])
            n = min(n, int(np.searchsorted(c, p.top_p * c[-1], side="left")) + 1)
        keep = np.flatnonzero(w[:n] >= p.min_p) if p.min_p > 0 else np.arange(n)
        return order[keep], w[keep]


def penalise(logits: np.ndarray, history: Sequence[int], r: float) -> np.ndarray:
    """Repetition penalty in float64 on the distinct ids of `history` (see the module docstring)."""
    x = np.asarray(logits, np.float64).copy()
    ids = np.unique(np.asarray(list(history), np.int64))
    if ids.size and (ids[0] < 0 or ids[-1] >= x.size):
        raise K3Error(f"history ids must be in 0..{x.size - 1} for the repetition penalty")
    v = x[ids]
    x[ids] = np.where(v > 0, v / r, v * r)
    return x


class StopMatcher:
    """Finds stop strings in text fed piece by piece.

    `feed(text) -> (safe, stopped)`: `safe` is the text that can be shown now; the longest tail
    that could still begin a stop string is held back. When a stop string completes, `safe` ends
    right before it, `stopped` is True, `self.stop` names it, and later input is ignored.
    `flush()` returns what is still held back (call it when generation ends for another reason).
    """

    def __init__(self, stop_strings: Iterable[str]) -> None:
        self.stops = tuple(s for s in stop_strings if s)
        self.held = ""
        self.stop: str | None = None

    def feed(self, text: str) -> tuple[str, bool]:
        if self.stop is not None:
            return "", True
        buf = self.held + text
        hits = [(buf.find(s), s) for s in self.stops if s in buf]
        if hits:
            pos, self.stop = min(hits, key=lambda h: h[0])
            self.held = ""
            return buf[:pos], True
        keep = max((k for s in self.stops for k in range(min(len(s) - 1, len(buf)), 0, -1)
                    if buf.endswith(s[:k])), default=0)
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep], False

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out
