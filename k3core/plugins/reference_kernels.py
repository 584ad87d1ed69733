"""The `reference` kernel backend: numpy, float64 inside, float32 at every boundary.

It follows docs/NUMERICS.md to the letter (16 lanes, lane = index mod 16, fixed pairwise
combine), so each token's result is the same whether it runs alone or in a batch. It is the
readable definition, not the fast path.
"""
from __future__ import annotations

import numpy as np

from ..plugin_api import E2M1, ExpertWeights, KernelBackend, Param, hookimpl, scale_multipliers

LANES = 16
_BLOCK_BYTES = 32 << 20  # rows of a weight widened to float64 at once


def combine_lanes(acc: np.ndarray) -> np.ndarray:
    """Fold the 16 lane partial sums (last axis): lane j += lane j+w for w = 8, 4, 2, 1."""
    for w in (8, 4, 2, 1):
        acc = acc[..., :w] + acc[..., w:2 * w]
    return acc[..., 0]


def lane_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Σ_i a[..., i]·b[..., i] in float64; product i goes to lane i mod 16, in index order."""
    n = a.shape[-1]
    acc = np.zeros(np.broadcast_shapes(a.shape[:-1], b.shape[:-1]) + (LANES,))
    full = n - n % LANES
    for j in range(0, full, LANES):
        acc += a[..., j:j + LANES] * b[..., j:j + LANES]
    if full < n:
        acc[..., :n - full] += a[..., full:] * b[..., full:]
    return combine_lanes(acc)


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


CANONICAL_NAN = np.array(0x7FC00000, np.uint32).view(np.float32)


def _f32(x) -> np.ndarray:
    """A result at a float32 boundary: rounded once, any NaN stored as the canonical quiet NaN."""
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.asarray(x).astype(np.float32)
    y[np.isnan(y)] = CANONICAL_NAN
    return y


def _sigmoid64(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _row_blocks(rows: int, row_bytes: int):
    step = max(1, _BLOCK_BYTES // max(1, row_bytes))
    for r0 in range(0, rows, step):
        yield r0, min(rows, r0 + step)


def int8_linear(codes: np.ndarray, scales: np.ndarray, x: np.ndarray) -> np.ndarray:
    """A draft's int8 rows: f32(scale[o] · lane_dot(codes[o], x[t])). Each code·x is exact in float64, so only the
    lane additions round, then the one product by the row's scale, then the float32 boundary."""
    rows, cols = codes.shape
    x64 = _f64(x)[:, None, :]
    out = np.empty((x.shape[0], rows), dtype=np.float32)
    for r0, r1 in _row_blocks(rows, cols * 8):
        with np.errstate(over="ignore", invalid="ignore"):  # a huge, infinite or NaN scale follows IEEE
            out[:, r0:r1] = _f32(lane_dot(x64, _f64(codes[r0:r1])[None]) * _f64(scales[r0:r1]))
    return out


def int4_weights(packed: np.ndarray, scales: np.ndarray, cols: int) -> np.ndarray:
    """float64 weights [rows, cols] of a draft's int4 groups: code · scale, exact (a 4-bit code times a float32);
    column 2k is the LOW nibble of byte k, code = nibble − 8; the last group's padding columns are dropped."""
    nibbles = np.empty((packed.shape[0], 2 * packed.shape[1]), dtype=np.uint8)
    nibbles[:, 0::2], nibbles[:, 1::2] = packed & 0x0F, packed >> 4
    with np.errstate(invalid="ignore"):  # 0 · inf: NaN, as in C
        return (nibbles[:, :cols].astype(np.float64) - 8) * np.repeat(_f64(scales), 32, axis=1)[:, :cols]


def int4_linear(packed: np.ndarray, scales: np.ndarray, cols: int, x: np.ndarray) -> np.ndarray:
    """A draft's int4 groups: f32(lane_dot(code · scale, x[t])), a bounded block of rows widened at a time."""
    rows = packed.shape[0]
    x64 = _f64(x)[:, None, :]
    out = np.empty((x.shape[0], rows), dtype=np.float32)
    for r0, r1 in _row_blocks(rows, cols * 8):
        out[:, r0:r1] = _f32(lane_dot(x64, int4_weights(packed[r0:r1], scales[r0:r1], cols)[None]))
    return out


def _mxfp4_lane_values(packed: np.ndarray, mult: np.ndarray, j: int) -> np.ndarray:
    """float64 weights of columns j..j+15 (one lane chunk) decoded from 8 packed bytes per row."""
    chunk = packed[:, j // 2:j // 2 + LANES // 2]
    codes = np.empty((packed.shape[0], chunk.shape[1] * 2), dtype=np.uint8)
    codes[:, 0::2] = chunk & 0x0F  # element 2k is the LOW nibble
    codes[:, 1::2] = chunk >> 4
    return E2M1[codes] * mult[:, j // 32, None]


class ReferenceKernels(KernelBackend):
    name = "reference"
    description = "numpy float64 reference (the readable definition; slow)"
    bit_exact = False  # numpy's exp/tanh: the scalar backend's bits wherever no transcendental is involved
    has_draft_kernels = True

    def linear(self, w: Param, x: np.ndarray) -> np.ndarray:
        rows, cols = w.shape
        x64 = _f64(x)[:, None, :]
        out = np.empty((x.shape[0], rows), dtype=np.float32)
        for r0, r1 in _row_blocks(rows, cols * 8):
            block = _f64(Param(w.data[r0:r1], w.dtype).f32())
            out[:, r0:r1] = _f32(lane_dot(x64, block[None, :, :]))
        return out

    def mxfp4_linear(self, packed: np.ndarray, scale: np.ndarray, x: np.ndarray) -> np.ndarray:
        """lane_dot with weights decoded 16 columns at a time, straight from the packed bytes."""
        x64, mult = _f64(x), scale_multipliers(scale)
        acc = np.zeros((x.shape[0], packed.shape[0], LANES))
        for j in range(0, packed.shape[1] * 2, LANES):  # widths are multiples of 32: no tail
            acc += x64[:, None, j:j + LANES] * _mxfp4_lane_values(packed, mult, j)[None, :, :]
        return _f32(combine_lanes(acc))

    def int8_linear(self, codes, scales, x):
        return int8_linear(codes, scales, x)

    def int4_linear(self, packed, scales, cols, x):
        return int4_linear(packed, scales, cols, x)

    def expert(self, e: ExpertWeights, z, beta, linear_beta):
        g = self.mxfp4_linear(e.w1_packed, e.w1_scale, z)
        u = self.mxfp4_linear(e.w3_packed, e.w3_scale, z)
        return self.mxfp4_linear(e.w2_packed, e.w2_scale, self.situ_glu(g, u, beta, linear_beta))

    def rmsnorm(self, x, w, eps):
        x64 = _f64(x)
        ms = lane_dot(x64, x64) / x.shape[-1]
        y = x64 / np.sqrt(ms + eps)[..., None]
        if w is not None:
            y = y * _f64(w)
        return _f32(y)

    def l2norm_heads(self, x, heads, eps):
        x64 = _f64(x).reshape(x.shape[0], heads, -1)  # [T, heads, D]
        y = x64 / np.sqrt(lane_dot(x64, x64) + eps)[..., None]
        return _f32(y.reshape(x.shape))

    def situ_glu(self, g, u, beta, linear_beta):
        g64, u64 = _f64(g), _f64(u)
        capped = beta * np.tanh(g64 / beta)
        return _f32(capped * _sigmoid64(g64) * (linear_beta * np.tanh(u64 / linear_beta)))

    def sigmoid(self, x):
        return _f32(_sigmoid64(_f64(x)))

    def mul_sigmoid(self, y, g):
        return _f32(_f64(y) * _sigmoid64(_f64(g)))

    def short_conv(self, x, history, w):
        K = w.shape[1]
        window = np.concatenate([history, x], axis=0)  # [K-1+T, C], oldest first
        T = x.shape[0]
        acc = np.zeros(x.shape)
        for tap in range(K):  # tap K-1 multiplies the current input
            acc += _f64(w[:, tap]) * _f64(window[tap:tap + T])
        y = acc * _sigmoid64(acc)  # SiLU after the conv
        return _f32(y), np.ascontiguousarray(window[T:])

    def kda_decay(self, z, a_log, dt_bias, lower_bound):
        T, heads, D = z.shape
        zz = _f64(z) + _f64(dt_bias).reshape(heads, D)
        rate = np.exp(_f64(a_log))[None, :, None]  # A_log is per head
        return _f32(np.exp(lower_bound * _sigmoid64(rate * zz)))

    def kda_recurrence(self, q, k, v, alpha, beta, state, scale):
        S = state.astype(np.float32)
        out = np.empty(q.shape, dtype=np.float32)
        for t in range(q.shape[0]):
            k64, q64 = _f64(k[t]), _f64(q[t]) * scale  # [heads, D]
            S64 = _f64(S) * _f64(alpha[t])[:, :, None]  # decay rows first
            u = lane_dot(S64.transpose(0, 2, 1), k64[:, None, :])  # u = Sᵀ k
            d = _f64(beta[t])[:, None] * (_f64(v[t]) - u)
            S = _f32(S64 + k64[:, :, None] * d[:, None, :])
            out[t] = _f32(lane_dot(_f64(S).transpose(0, 2, 1), q64[:, None, :]))  # o = Sᵀ q, UPDATED state
        return out, S

    def mqa_attention(self, q, keys, values, scale):
        scores = lane_dot(_f64(q)[:, None, :], _f64(keys)[None, :, :]) * scale  # [heads, n]
        e = np.exp(scores - scores.max(axis=1, keepdims=True))
        p = e / lane_dot(e, np.ones_like(e))[:, None]
        return _f32(lane_dot(p[:, None, :], _f64(values).T[None, :, :]))  # [heads, dv]

    def router(self, logits, bias, top_k, renormalize, scaling):
        s = _sigmoid64(_f64(logits))
        biased = s + _f64(bias)
        ids = np.argsort(-biased, axis=1, kind="stable")[:, :top_k]  # ties: lowest index first
        w = np.take_along_axis(s, ids, axis=1)  # combine weights from the UNBIASED scores
        if renormalize:
            total = np.zeros(w.shape[0])
            for j in range(top_k):
                total = total + w[:, j]
            w = w / (total + 1e-20)[:, None]
        return ids.astype(np.int64), _f32(w * scaling)

    def combine(self, outputs, weights):
        acc = np.zeros(outputs[0].shape)
        for out, w in zip(outputs, weights):
            acc = acc + float(w) * _f64(out)
        return _f32(acc)

    def attnres(self, sources, fold, eps):
        src = _f64(np.stack(sources))  # [S, T, H]
        H = src.shape[-1]
        rms = np.sqrt(lane_dot(src, src) / H + eps)
        scores = lane_dot(src, _f64(fold)) / rms  # [S, T]
        e = np.exp(scores - scores.max(axis=0))
        total = np.zeros(e.shape[1])
        for s in range(e.shape[0]):
            total = total + e[s]
        acc = np.zeros(src.shape[1:])
        for s in range(src.shape[0]):  # values are the RAW sources
            acc = acc + (e[s] / total)[:, None] * src[s]
        return _f32(acc)


@hookimpl(trylast=True)
def k3_kernel_backends():
    return [ReferenceKernels()]
