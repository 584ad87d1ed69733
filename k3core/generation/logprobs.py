"""Log-probabilities of ids under the model's logits, the same bits everywhere the logits are the same bits.

Definition, for one row of logits l [V] (float32, read exactly as float64 x):
  m = max x;  S = Σ det_exp(x_i − m), summed by `math.fsum` (the correctly rounded sum, so no order enters);
  logprob(i) = (x_i − m) − det_log(S).
`det_exp` is the sampler's fixed polynomial (sampling.py) and `det_log` the fixed series below: only IEEE-exact
operations, never libm's or numpy's SIMD transcendentals, whose last bits vary by machine. The logits are
identical across budgets, kernel backends, threads, batches and speculation, so these numbers are too. They are
the model's distribution: before the repetition penalty, temperature and filters a Sampler applies. The
alternatives are the `top` highest logits, ties broken by lowest id. Checked by tests/serve/test_logprobs.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .sampling import _LN2_HI, _LN2_LO, det_exp

_SQRT_HALF = 0.70710678118654752440
_ATANH_COEF = [1.0 / (2 * k + 1) for k in range(13)]  # log m = 2 atanh z; z² < 0.0295: error < 1e-19 at z**25


def det_log(s: float) -> float:
    """log(s) for a finite s > 0, within a few ulp, bit-identical on every IEEE machine."""
    m, e = math.frexp(s)  # s = m · 2**e exactly, m in [0.5, 1)
    if m < _SQRT_HALF:
        m, e = 2.0 * m, e - 1  # m in [√½, √2): |z| <= 0.1716
    z = (m - 1.0) / (m + 1.0)
    z2, p = z * z, _ATANH_COEF[-1]
    for c in reversed(_ATANH_COEF[:-1]):
        p = p * z2 + c  # Python floats: one rounding per operation, no fused multiply-add
    return e * _LN2_HI + (e * _LN2_LO + 2.0 * z * p)


@dataclass(frozen=True)
class TokenLogprob:
    """The log-probability of `token` and of the `top` alternatives, (id, logprob) by logit descending."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(logits: np.ndarray, token: int, top: int = 0) -> TokenLogprob:
    """`token`'s log-probability under `logits` [V], and the `top` most likely ids' (module docstring)."""
    x = np.asarray(logits, np.float64)  # [V]; float32 -> float64 is exact
    m = x.max()
    log_s = det_log(math.fsum(det_exp(x - m).tolist()))

    def logprob(i: int) -> float:
        return float((x[i] - m) - log_s)

    return TokenLogprob(int(token), logprob(token), tuple((int(i), logprob(i)) for i in top_ids(x, top)))


def top_ids(x: np.ndarray, n: int) -> np.ndarray:
    """The ids of the `n` highest values of `x`, highest first, ties by lowest id."""
    n = min(n, x.size)
    if n <= 0:
        return np.empty(0, np.int64)
    threshold = np.partition(x, x.size - n)[x.size - n]  # the n-th highest value
    ids = np.flatnonzero(x >= threshold)  # ascending ids: a stable sort keeps ties in id order
    return ids[np.argsort(-x[ids], kind="stable")][:n]
