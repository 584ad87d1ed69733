"""The kernel cases: one table of seeded inputs on which every kernel backend must give the scalar
backend's bits. It drives tests/native (every built-in SIMD backend) and the conformance kit (any
backend, `k3 plugins --check`): adding a kernel case means adding it here.

Inputs reach every special case the contract names (docs/NUMERICS.md): widths that are not multiples
of any SIMD width, ±inf, NaN, subnormals, huge values, MXFP4 scale bytes 0/1/254/255, draft scales 0,
subnormal, huge, inf and NaN (int4's padded last group among them), and "cancelling" inputs whose large
products cancel exactly only when lane j meets lane j+8 in the fold, so any other lane order gives other bits.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..interfaces import ExpertWeights, Param

WIDTHS = (1, 3, 15, 16, 17, 33, 100, 257)   # in-widths: not multiples of any SIMD width, and some that are
MX_WIDTHS = (32, 96, 160, 352)
INT4_WIDTHS = (1, 15, 17, 31, 32, 33, 100, 257)  # most end in a padded group of 32
SHAPES = ((1, 1), (3, 2), (17, 5), (33, 64))  # (rows, tokens)
DRAFT_SHAPES = ((1, 1), (3, 2), (5, 3), (17, 4), (9, 5), (33, 17), (7, 33))  # each native path's token counts
INPUTS = ("random", "adversarial", "cancelling")
THREADS = (1, 2, 5)


@dataclass(frozen=True)
class KernelCase:
    name: str
    kernel: str                       # the KernelBackend method
    call: Callable                    # backend -> result (an array or a tuple of arrays)
    uses_libm: bool = False           # exp / tanh inside: the numpy reference may differ in the last bit


def rng(seed):
    return np.random.default_rng(seed)


def activations(r, shape, adversarial=False):
    x = r.standard_normal(shape).astype(np.float32)
    if adversarial:
        flat = x.reshape(-1)
        picks = r.choice(flat.size, size=max(1, flat.size // 8), replace=False)
        specials = np.array([np.inf, -np.inf, np.nan, 1e-45, -1e-44, 3e38, -3e38, 1e-38, 0.0, -0.0], np.float32)
        flat[picks] = specials[r.integers(0, len(specials), len(picks))]
    return x


def cancelling(r, shape):
    """Large values that cancel only when lane j meets lane j+8, among small ones that survive only if
    they are added at the right step."""
    x = r.standard_normal(shape).astype(np.float32)
    for start in range(0, shape[-1] - 8, 16):
        big = np.float32(r.choice([1e16, -3e15, 7e17]))
        x[..., start] = big
        x[..., start + 8] = -big
    return x


def bf16_weights(r, rows, cols, adversarial=False):
    w = (r.standard_normal((rows, cols)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    if adversarial:
        flat = w.reshape(-1)
        picks = r.choice(flat.size, size=max(1, flat.size // 8), replace=False)
        specials = np.array([0x7F80, 0xFF80, 0x7FC0, 0x0001, 0x8003, 0x7F7F, 0x0000, 0x8000], np.uint16)
        flat[picks] = specials[r.integers(0, len(specials), len(picks))]
    return w


def mxfp4_weights(r, rows, cols, adversarial=False):
    packed = r.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
    scale = r.integers(110, 135, (rows, cols // 32), dtype=np.uint8)
    if adversarial:
        flat = scale.reshape(-1)
        flat[r.choice(flat.size, size=max(1, flat.size // 3), replace=False)] = r.choice(
            np.array([0, 1, 254, 255], np.uint8), size=max(1, flat.size // 3))
    return packed, scale


def draft_scales(r, shape, adversarial=False):
    """float32 scales as k3 pack --draft makes them (max|w| / limit), and adversarially 0, subnormal, huge, inf, NaN."""
    scales = r.uniform(1e-4, 0.05, shape).astype(np.float32)
    if adversarial:
        flat = scales.reshape(-1)
        specials = np.array([0.0, 1e-45, 3e-41, 1e-38, 3e38, 1e30, np.inf, np.nan, -0.5], np.float32)
        picks = r.choice(flat.size, size=max(1, flat.size // 3), replace=False)
        flat[picks] = specials[r.integers(0, len(specials), len(picks))]
    return scales


def int8_weights(r, rows, cols, adversarial=False):
    codes = r.integers(-127, 128, (rows, cols), dtype=np.int8)
    if adversarial:
        codes.reshape(-1)[r.choice(codes.size, size=max(1, codes.size // 8))] = -128  # outside k3's [-127, 127]
    return codes, draft_scales(r, rows, adversarial)


def int4_weights(r, rows, cols, adversarial=False):
    """Packed bytes [rows, G·16] with random padding nibbles (never read), and scales [rows, G]."""
    groups = -(-cols // 32)
    return r.integers(0, 256, (rows, groups * 16), dtype=np.uint8), draft_scales(r, (rows, groups), adversarial)


def cancel_pairs(w, x, r):
    """Make the products of columns s and s+8 (s = 0, 16, …) equal and opposite, and large."""
    for s in range(0, x.shape[1] - 8, 16):
        w[:, s + 8] = w[:, s]
        big = np.float32(r.choice([1e12, -3e15, 7e17]))
        x[:, s], x[:, s + 8] = big, -big


def _linear_cases():
    r = rng(1)
    for dtype in ("BF16", "F16", "F32"):
        for inputs in INPUTS:
            adversarial = inputs == "adversarial"
            for cols in WIDTHS:
                for rows, tokens in SHAPES:
                    if dtype == "BF16":
                        w = bf16_weights(r, rows, cols, adversarial)
                    elif dtype == "F16":
                        with np.errstate(over="ignore"):  # huge values become f16 infinities: wanted
                            w = activations(r, (rows, cols), adversarial).astype(np.float16).view(np.uint16)
                    else:
                        w = activations(r, (rows, cols), adversarial)
                    x = activations(r, (tokens, cols), adversarial)
                    if inputs == "cancelling":
                        cancel_pairs(w, x, r)
                    p = Param(w, dtype)
                    yield KernelCase(f"linear {dtype} {inputs} {rows}x{cols} T={tokens}", "linear",
                                     lambda k, p=p, x=x: k.linear(p, x))


def _mxfp4_cases():
    r = rng(2)
    for inputs in INPUTS:
        for cols in MX_WIDTHS:
            for rows, tokens in SHAPES:
                packed, scale = mxfp4_weights(r, rows, cols, inputs == "adversarial")
                x = activations(r, (tokens, cols), inputs == "adversarial")
                if inputs == "cancelling":  # element s is the low nibble of byte s/2; s+8 that of byte s/2+4
                    for s in range(0, cols - 8, 16):
                        packed[:, s // 2 + 4] = (packed[:, s // 2 + 4] & 0xF0) | (packed[:, s // 2] & 0x0F)
                        big = np.float32(r.choice([1e12, -3e15, 7e17]))
                        x[:, s], x[:, s + 8] = big, -big
                yield KernelCase(f"mxfp4_linear {inputs} {rows}x{cols} T={tokens}", "mxfp4_linear",
                                 lambda k, a=(packed, scale, x): k.mxfp4_linear(*a))


def _draft_cases():
    r = rng(12)
    for inputs in INPUTS:
        adversarial = inputs == "adversarial"
        for cols in WIDTHS:
            for rows, tokens in DRAFT_SHAPES:
                codes, scales = int8_weights(r, rows, cols, adversarial)
                x = activations(r, (tokens, cols), adversarial)
                if inputs == "cancelling":
                    cancel_pairs(codes, x, r)
                yield KernelCase(f"int8_linear {inputs} {rows}x{cols} T={tokens}", "int8_linear",
                                 lambda k, a=(codes, scales, x): k.int8_linear(*a))
        for cols in INT4_WIDTHS:
            for rows, tokens in DRAFT_SHAPES:
                packed, scales = int4_weights(r, rows, cols, adversarial)
                if adversarial and cols % 32:  # the padded group's scale infinite or NaN: its padding stays unread
                    scales[::2, -1] = np.float32(np.inf) if cols % 2 else np.float32(np.nan)
                x = activations(r, (tokens, cols), adversarial)
                if inputs == "cancelling":  # column s is the low nibble of byte s/2; s+8 that of byte s/2+4
                    for s in range(0, cols - 8, 16):
                        packed[:, s // 2 + 4] = (packed[:, s // 2 + 4] & 0xF0) | (packed[:, s // 2] & 0x0F)
                        big = np.float32(r.choice([1e12, -3e15, 7e17]))
                        x[:, s], x[:, s + 8] = big, -big
                yield KernelCase(f"int4_linear {inputs} {rows}x{cols} T={tokens}", "int4_linear",
                                 lambda k, a=(packed, scales, cols, x): k.int4_linear(*a))


def _lane_order_cases():
    """Inputs on which any lane mapping or fold order but the contract's gives other bits."""
    r = rng(7)
    x = np.zeros((1, 32), np.float32)
    x[0, 0], x[0, 1], x[0, 8] = 1e16, 1.0, -1e16
    yield KernelCase("linear lane order: [1e16, 1, 0…, -1e16 at 8]", "linear",
                     lambda k: k.linear(Param(np.ones((1, 32), np.float32), "F32"), x))
    ones = (np.full((1, 16), 0x22, np.uint8), np.full((1, 1), 127, np.uint8))  # every weight 1.0
    yield KernelCase("mxfp4_linear lane order: [1e16, 1, 0…, -1e16 at 8]", "mxfp4_linear",
                     lambda k: k.mxfp4_linear(*ones, x))
    one = np.ones(1, np.float32)
    yield KernelCase("int8_linear lane order: [1e16, 1, 0…, -1e16 at 8]", "int8_linear",
                     lambda k: k.int8_linear(np.ones((1, 32), np.int8), one, x))
    yield KernelCase("int4_linear lane order: [1e16, 1, 0…, -1e16 at 8]", "int4_linear",  # nibble 9: code 1
                     lambda k: k.int4_linear(np.full((1, 16), 0x99, np.uint8), one[:, None], 32, x))
    for cols in (17, 100):
        xc, (codes, scales) = cancelling(r, (5, cols)), int8_weights(r, 9, cols)
        for start in range(0, cols - 8, 16):
            codes[:, start + 8] = codes[:, start]  # equal codes: the large products cancel exactly
        yield KernelCase(f"int8_linear lane order {cols} columns", "int8_linear",
                         lambda k, a=(codes, scales, xc): k.int8_linear(*a))
    for cols in (17, 33, 100, 257):
        xc, w = cancelling(r, (5, cols)), bf16_weights(r, 9, cols)
        for start in range(0, cols - 8, 16):
            w[:, start + 8] = w[:, start]  # equal weights: the large products cancel exactly
        yield KernelCase(f"linear BF16 lane order {cols} columns", "linear",
                         lambda k, p=Param(w, "BF16"), xc=xc: k.linear(p, xc))
    packed = np.full((9, 48), 0x22, np.uint8)
    packed[:, 2:] = r.integers(0, 256, (9, 46), dtype=np.uint8)
    packed[:, 4] = packed[:, 0]
    scale = r.integers(120, 130, (9, 3), dtype=np.uint8)
    xm = cancelling(r, (5, 96))
    yield KernelCase("mxfp4_linear lane order 96 columns", "mxfp4_linear", lambda k: k.mxfp4_linear(packed, scale, xm))


def expert_case(r, latent=96, inter=64):
    w1, w2, w3 = mxfp4_weights(r, inter, latent), mxfp4_weights(r, latent, inter), mxfp4_weights(r, inter, latent)
    return ExpertWeights(1, 0, *w1, *w2, *w3), activations(r, (3, latent)) * 4


def kda_inputs(r, tokens, heads, d, adversarial=False):
    """q, k, v, alpha, beta, state for kda_recurrence; adversarial: q, k, v and the state with infinities, NaNs,
    subnormals and values whose update overflows float32."""
    q, k, v = (activations(r, (tokens, heads, d), adversarial) for _ in range(3))
    alpha = np.exp(-np.abs(activations(r, (tokens, heads, d)))).astype(np.float32)
    beta = 1 / (1 + np.exp(-activations(r, (tokens, heads)))).astype(np.float32)
    return q, k, v, alpha, beta, activations(r, (heads, d, d), adversarial)


def kda_order_inputs(r, tokens=2, heads=2, d=41):
    """kda_recurrence's inputs where both walks over the state depend on the lane order. u = (S·α)ᵀ k: keys 0..7
    big and keys 8..15 their negatives on rows that decay alike, the other keys small; o = Sᵀ q the same way on rows
    16..31, whose updates are alike too (equal keys). Each big product shares its lane with small ones, which it
    absorbs; the big ones cancel only when lane i meets lane i + 8 in the fold."""
    q, k, v, alpha, beta, state = kda_inputs(r, tokens, heads, d)
    k[..., :8] = r.choice([1e16, -3e15, 7e17], (tokens, heads, 8)).astype(np.float32)
    k[..., 8:16] = -k[..., :8]
    q[..., :16] = 0  # rows 0..15 grow huge by their keys' update: kept out of o
    q[..., 16:24] = r.choice([1e16, -3e15, 7e17], (tokens, heads, 8)).astype(np.float32)
    q[..., 24:32] = -q[..., 16:24]
    k[..., 24:32] = k[..., 16:24]
    for first in (0, 16):
        alpha[..., first + 8:first + 16] = alpha[..., first:first + 8]
        state[:, first + 8:first + 16, :] = state[:, first:first + 8, :]
    return q, k, v, alpha, beta, state


def _other_cases():
    """Every kernel that is not a matrix product, on awkward sizes."""
    r = rng(4)
    x = activations(r, (5, 37), adversarial=True)
    g, u = activations(r, (4, 19)) * 30, activations(r, (4, 19)) * 60
    z = activations(r, (3, 5, 7))
    q, k_, v = (activations(r, (4, 3, 19)) for _ in range(3))
    alpha = np.exp(-np.abs(activations(r, (4, 3, 19)))).astype(np.float32)
    beta = 1 / (1 + np.exp(-activations(r, (4, 3)))).astype(np.float32)
    state = activations(r, (3, 19, 19))
    keys, values = activations(r, (23, 41)), activations(r, (23, 37))
    logits, bias = activations(r, (6, 13)), (r.uniform(-0.3, 0.3, 13)).astype(np.float32)
    logits[0, :4] = 0.25  # ties
    srcs = [activations(r, (5, 37)) for _ in range(7)]
    fold = r.standard_normal(37)
    e, zz = expert_case(r)
    l2 = activations(rng(9), (5, 36))
    conv_w = activations(rng(8), (37, 4))
    decay = (activations(rng(7), (5,)), activations(rng(6), (35,)))
    query = activations(rng(5), (6, 41))
    even_keys, even_values = activations(rng(10), (41, 41)), activations(rng(11), (41, 37))
    even_values[:8] = rng(11).choice([1e16, -3e15, 7e17], (8, 37)).astype(np.float32)
    even_values[8:16] = -even_values[:8]  # positions 0..7 big, 8..15 their negatives, each beside small ones
    kda_wide, kda_order = kda_inputs(rng(12), 3, 2, 37, adversarial=True), kda_order_inputs(rng(13))
    # more heads than a tile's 4, values 2 blocks of 32 columns and a tail, positions past many lane cycles
    long_attention = activations(rng(14), (7, 72)), activations(rng(15), (300, 72)), activations(rng(16), (300, 80))
    yield KernelCase("rmsnorm", "rmsnorm", lambda k: k.rmsnorm(x, x[0], 1e-5))
    yield KernelCase("rmsnorm without gain", "rmsnorm", lambda k: k.rmsnorm(x, None, 1e-5))
    yield KernelCase("l2norm_heads", "l2norm_heads", lambda k: k.l2norm_heads(l2, 4, 1e-6))
    yield KernelCase("situ_glu", "situ_glu", lambda k: k.situ_glu(g, u, 4.0, 25.0), uses_libm=True)
    yield KernelCase("sigmoid", "sigmoid", lambda k: k.sigmoid(x), uses_libm=True)
    yield KernelCase("mul_sigmoid", "mul_sigmoid", lambda k: k.mul_sigmoid(g, u), uses_libm=True)
    yield KernelCase("short_conv", "short_conv", lambda k: k.short_conv(x, x[:3], conv_w), uses_libm=True)
    yield KernelCase("kda_decay", "kda_decay", lambda k: k.kda_decay(z, *decay, -5.0), uses_libm=True)
    yield KernelCase("kda_recurrence", "kda_recurrence",
                     lambda k: k.kda_recurrence(q, k_, v, alpha, beta, state, 19 ** -0.5))
    # 37 columns: a SIMD row's full steps and a tail
    yield KernelCase("kda_recurrence, wide heads and special values", "kda_recurrence",
                     lambda k: k.kda_recurrence(*kda_wide, 37 ** -0.5))
    # a walk of the state's rows that gives row i a lane other than i % 16 changes the state's bits
    yield KernelCase("kda_recurrence, lane order", "kda_recurrence",
                     lambda k: k.kda_recurrence(*kda_order, 41 ** -0.5))
    yield KernelCase("mqa_attention", "mqa_attention", lambda k: k.mqa_attention(query, keys, values, 41 ** -0.5),
                     uses_libm=True)
    yield KernelCase("mqa_attention, 7 heads over 300 positions", "mqa_attention",
                     lambda k: k.mqa_attention(*long_attention, 72 ** -0.5), uses_libm=True)
    # a zero query scores every key 0, so every weight is exp(0) / n with no libm in it: the value walk's lane order
    # is then checked against the reference, on values whose large rows cancel only when row m meets row m + 8
    yield KernelCase("mqa_attention, equal scores", "mqa_attention",
                     lambda k: k.mqa_attention(np.zeros((3, 41), np.float32), even_keys, even_values, 41 ** -0.5))
    yield KernelCase("router", "router", lambda k: k.router(logits, bias, 4, True, 2.5), uses_libm=True)
    yield KernelCase("combine", "combine", lambda k: k.combine(srcs[:3], np.array([0.5, 0.25, 0.125], np.float32)))
    yield KernelCase("attnres", "attnres", lambda k: k.attnres(srcs, fold, 1e-5), uses_libm=True)
    yield KernelCase("expert", "expert", lambda k: k.expert(e, zz, 4.0, 25.0), uses_libm=True)


def kernel_cases() -> list[KernelCase]:
    """Every case, in a fixed order (the same inputs on every call)."""
    return [*_linear_cases(), *_mxfp4_cases(), *_draft_cases(), *_lane_order_cases(), *_other_cases()]


def batch_cases():
    """(name, call(backend) -> the batch's rows, call(backend, t) -> row t computed alone): a batch of
    tokens gives each token its single-token bytes."""
    r = rng(3)
    w, x = bf16_weights(r, 40, 100), activations(r, (150, 100))  # 150: past two of the native token tiles (64 here)
    packed, scale = mxfp4_weights(r, 40, 96)
    xm = activations(r, (150, 96))
    p = Param(w, "BF16")
    codes, scales = int8_weights(r, 40, 100)
    packed4, scales4 = int4_weights(r, 40, 100)
    # Wide rows: the native module's token tiles hold at most 1 MiB of x as doubles (31 tokens of 4,100 columns,
    # 32 of 4,096), so 70 tokens run as three tiles.
    pw = Param(bf16_weights(r, 3, 4100), "BF16")
    xw = activations(r, (70, 4100))
    packed_w, scale_w = mxfp4_weights(r, 3, 4096)
    xmw = activations(r, (70, 4096))
    return [("linear BF16, 150 tokens", lambda k: k.linear(p, x), lambda k, t: k.linear(p, x[t:t + 1])),
            ("mxfp4_linear, 150 tokens", lambda k: k.mxfp4_linear(packed, scale, xm),
             lambda k, t: k.mxfp4_linear(packed, scale, xm[t:t + 1])),
            ("linear BF16, 70 tokens of 4,100 columns", lambda k: k.linear(pw, xw),
             lambda k, t: k.linear(pw, xw[t:t + 1])),
            ("mxfp4_linear, 70 tokens of 4,096 columns", lambda k: k.mxfp4_linear(packed_w, scale_w, xmw),
             lambda k, t: k.mxfp4_linear(packed_w, scale_w, xmw[t:t + 1])),
            ("int8_linear, 150 tokens", lambda k: k.int8_linear(codes, scales, x),
             lambda k, t: k.int8_linear(codes, scales, x[t:t + 1])),
            ("int4_linear, 150 tokens", lambda k: k.int4_linear(packed4, scales4, 100, x),
             lambda k, t: k.int4_linear(packed4, scales4, 100, x[t:t + 1]))]


def bits(a) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint8)


def same(a, b) -> bool:
    """Byte-identical results (a tuple compares element by element)."""
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    return len(a) == len(b) and all(np.asarray(x).shape == np.asarray(y).shape and np.array_equal(bits(x), bits(y))
                                    for x, y in zip(a, b))
