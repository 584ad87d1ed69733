"""Every native kernel on every backend this machine runs gives the scalar backend's bytes, on
random and adversarial inputs, at 1, 2 and more threads than cores; a batch of tokens gives each
token its single-token bytes; and the C++ scalar backend equals the numpy reference where no
transcendental function is involved (both implement docs/NUMERICS.md)."""
import numpy as np
import pytest

from k3core import _native
from k3core.interfaces import ExpertWeights, Param
from k3core.plugins.native_kernels import NativeKernels
from k3core.plugins.reference_kernels import ReferenceKernels

BACKENDS = _native.available_backends()
SIMD = [b for b in BACKENDS if b != "scalar"]
THREADS = [1, 2, 5]


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint8)


def same(a, b):
    return a.shape == b.shape and np.array_equal(bits(a), bits(b))


def kernels(name, threads=1):
    k = NativeKernels(name)
    k.set_threads(threads)
    return k


def rng(seed):
    return np.random.default_rng(seed)


def activations(r, shape, adversarial=False):
    x = r.standard_normal(shape).astype(np.float32)
    if adversarial:
        flat = x.reshape(-1)
        n = flat.size
        picks = r.choice(n, size=max(1, n // 8), replace=False)
        specials = np.array([np.inf, -np.inf, np.nan, 1e-45, -1e-44, 3e38, -3e38, 1e-38, 0.0, -0.0], np.float32)
        flat[picks] = specials[r.integers(0, len(specials), len(picks))]
    return x


def cancelling(r, shape):
    """Inputs on which the summation order shows: large values that cancel only when lane j meets
    lane j+8 in the fold, among small ones that survive only if they are added at the right step."""
    x = r.standard_normal(shape).astype(np.float32)
    cols = shape[-1]
    for start in range(0, cols - 8, 16):
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


# in-widths that are not multiples of any SIMD width, and some that are
WIDTHS = [1, 3, 15, 16, 17, 33, 100, 257]
MX_WIDTHS = [32, 96, 160, 352]
SHAPES = [(1, 1), (3, 2), (17, 5), (33, 64)]  # (rows, tokens)


def cancel_pairs(w, x, r):
    """Make the products of columns s and s+8 (s = 0, 16, 32, …) equal and opposite, and large:
    they cancel exactly only if lane s meets lane s+8 where the contract says."""
    for s in range(0, x.shape[1] - 8, 16):
        w[:, s + 8] = w[:, s]
        big = np.float32(r.choice([1e12, -3e15, 7e17]))
        x[:, s], x[:, s + 8] = big, -big


INPUTS = ["random", "adversarial", "cancelling"]


@pytest.mark.parametrize("backend", SIMD)
@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
@pytest.mark.parametrize("inputs", INPUTS)
def test_linear_matches_scalar(backend, dtype, inputs):
    r = rng(1)
    adversarial = inputs == "adversarial"
    for cols in WIDTHS:
        for rows, tokens in SHAPES:
            if dtype == "BF16":
                w = bf16_weights(r, rows, cols, adversarial)
            elif dtype == "F16":
                w = activations(r, (rows, cols), adversarial).astype(np.float16).view(np.uint16)
            else:
                w = activations(r, (rows, cols), adversarial)
            x = activations(r, (tokens, cols), adversarial)
            if inputs == "cancelling":
                cancel_pairs(w, x, r)
            want = kernels("scalar").linear(Param(w, dtype), x)
            for threads in THREADS:
                got = kernels(backend, threads).linear(Param(w, dtype), x)
                assert same(got, want), (backend, dtype, cols, rows, tokens, threads)


@pytest.mark.parametrize("backend", SIMD)
@pytest.mark.parametrize("inputs", INPUTS)
def test_mxfp4_matches_scalar(backend, inputs):
    r = rng(2)
    for cols in MX_WIDTHS:
        for rows, tokens in SHAPES:
            packed, scale = mxfp4_weights(r, rows, cols, inputs == "adversarial")
            x = activations(r, (tokens, cols), inputs == "adversarial")
            if inputs == "cancelling":  # element s is the low nibble of byte s/2; s+8 that of byte s/2+4
                for s in range(0, cols - 8, 16):
                    packed[:, s // 2 + 4] = (packed[:, s // 2 + 4] & 0xF0) | (packed[:, s // 2] & 0x0F)
                    big = np.float32(r.choice([1e12, -3e15, 7e17]))
                    x[:, s], x[:, s + 8] = big, -big
            want = kernels("scalar").mxfp4_linear(packed, scale, x)
            for threads in THREADS:
                assert same(kernels(backend, threads).mxfp4_linear(packed, scale, x), want), (backend, cols, rows)


@pytest.mark.parametrize("backend", SIMD)
def test_the_lane_order_shows_on_cancelling_inputs(backend):
    """Products that cancel only when lane j meets lane j+8 in the fold: any other lane mapping or
    fold order gives other bits (swapping lanes 0 and 1 turns [1e16, 1, 0.., -1e16 at 8] from 1 into 0)."""
    x = np.zeros((1, 32), np.float32)
    x[0, 0], x[0, 1], x[0, 8] = 1e16, 1.0, -1e16
    ones = np.full((1, 32), 0x22, np.uint8)[:, :16], np.full((1, 1), 127, np.uint8)  # every weight 1.0
    assert kernels(backend).linear(Param(np.ones((1, 32), np.float32), "F32"), x)[0, 0] == 1.0
    assert kernels(backend).mxfp4_linear(*ones, x)[0, 0] == 1.0
    r = rng(7)
    for cols in (17, 33, 100, 257):
        x, w = cancelling(r, (5, cols)), bf16_weights(r, 9, cols)
        for start in range(0, cols - 8, 16):
            w[:, start + 8] = w[:, start]  # equal weights: the large products cancel exactly
        want = kernels("scalar").linear(Param(w, "BF16"), x)
        assert same(kernels(backend).linear(Param(w, "BF16"), x), want), cols
    packed = np.full((9, 48), 0x22, np.uint8)
    packed[:, 2:] = r.integers(0, 256, (9, 46), dtype=np.uint8)  # elements 0..3 and 8.. vary, but 0 == 8
    packed[:, 4] = packed[:, 0]
    scale = r.integers(120, 130, (9, 3), dtype=np.uint8)
    xm = cancelling(r, (5, 96))
    assert same(kernels(backend).mxfp4_linear(packed, scale, xm), kernels("scalar").mxfp4_linear(packed, scale, xm))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batch_gives_each_token_its_single_token_bytes(backend):
    r = rng(3)
    k = kernels(backend, 2)
    w, x = bf16_weights(r, 40, 100), activations(r, (64, 100))
    packed, scale = mxfp4_weights(r, 40, 96)
    xm = activations(r, (64, 96))
    batch, batch_mx = k.linear(Param(w, "BF16"), x), k.mxfp4_linear(packed, scale, xm)
    for t in range(64):
        assert same(batch[t:t + 1], k.linear(Param(w, "BF16"), x[t:t + 1]))
        assert same(batch_mx[t:t + 1], k.mxfp4_linear(packed, scale, xm[t:t + 1]))


def expert_case(r, latent=96, inter=64):
    w1, w2, w3 = mxfp4_weights(r, inter, latent), mxfp4_weights(r, latent, inter), mxfp4_weights(r, inter, latent)
    return ExpertWeights(1, 0, *w1, *w2, *w3), activations(r, (3, latent)) * 4


def other_kernel_calls(r):
    """(name, call(k)) for every kernel that is not a matrix product, on awkward sizes."""
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
    return [
        ("rmsnorm", lambda k: k.rmsnorm(x, x[0], 1e-5)),
        ("rmsnorm without gain", lambda k: k.rmsnorm(x, None, 1e-5)),
        ("l2norm_heads", lambda k: k.l2norm_heads(activations(rng(9), (5, 36)), 4, 1e-6)),
        ("situ_glu", lambda k: k.situ_glu(g, u, 4.0, 25.0)),
        ("sigmoid", lambda k: k.sigmoid(x)),
        ("mul_sigmoid", lambda k: k.mul_sigmoid(g, u)),
        ("short_conv", lambda k: k.short_conv(x, x[:3], activations(rng(8), (37, 4)))),
        ("kda_decay", lambda k: k.kda_decay(z, activations(rng(7), (5,)), activations(rng(6), (35,)), -5.0)),
        ("kda_recurrence", lambda k: k.kda_recurrence(q, k_, v, alpha, beta, state, 19 ** -0.5)),
        ("mqa_attention", lambda k: k.mqa_attention(activations(rng(5), (6, 41)), keys, values, 41 ** -0.5)),
        ("router", lambda k: k.router(logits, bias, 4, True, 2.5)),
        ("combine", lambda k: k.combine(srcs[:3], np.array([0.5, 0.25, 0.125], np.float32))),
        ("attnres", lambda k: k.attnres(srcs, fold, 1e-5)),
        ("expert", lambda k: k.expert(e, zz, 4.0, 25.0)),
    ]


def flatten(result):
    return result if isinstance(result, tuple) else (result,)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_other_kernel_matches_scalar_at_every_thread_count(backend):
    want = {name: flatten(call(kernels("scalar"))) for name, call in other_kernel_calls(rng(4))}
    for threads in THREADS:
        for name, call in other_kernel_calls(rng(4)):
            got = flatten(call(kernels(backend, threads)))
            assert all(same(a, b) for a, b in zip(got, want[name])), (backend, name, threads)


def test_cpp_scalar_equals_the_numpy_reference_where_no_libm_is_involved():
    r, ref, cpp = rng(5), ReferenceKernels(), kernels("scalar")
    for cols in (17, 100, 256):
        w, x = bf16_weights(r, 9, cols), activations(r, (4, cols))
        assert same(cpp.linear(Param(w, "BF16"), x), ref.linear(Param(w, "BF16"), x))
        x2 = activations(r, (3, cols))
        assert same(cpp.rmsnorm(x2, x2[0], 1e-5), ref.rmsnorm(x2, x2[0], 1e-5))
    packed, scale = mxfp4_weights(r, 11, 160, adversarial=True)
    x = activations(r, (4, 160))
    assert same(cpp.mxfp4_linear(packed, scale, x), ref.mxfp4_linear(packed, scale, x))
    outs = [activations(r, (1, 64)) for _ in range(4)]
    weights = np.array([0.4, 0.3, 0.2, 0.1], np.float32)
    assert same(cpp.combine(outs, weights), ref.combine(outs, weights))
    assert same(cpp.l2norm_heads(outs[0], 4, 1e-6), ref.l2norm_heads(outs[0], 4, 1e-6))


def test_scale_255_groups_contribute_nothing():
    packed = np.full((2, 32), 0x77, np.uint8)  # every weight 6 × scale
    scale = np.array([[127, 255], [255, 255]], np.uint8)
    x = np.ones((1, 64), np.float32)
    for backend in BACKENDS:
        y = kernels(backend).mxfp4_linear(packed, scale, x)
        assert y.tolist() == [[6.0 * 32, 0.0]]


def test_nan_results_are_the_canonical_quiet_nan():
    x = np.array([[np.inf, 1.0]], np.float32)
    w = np.array([[0.0, 1.0]], np.float32)  # 0 × inf
    for backend in BACKENDS:
        assert kernels(backend).linear(Param(w, "F32"), x).view(np.uint32)[0, 0] == 0x7FC00000


def test_bad_arguments_are_refused_with_a_clear_message():
    k = kernels("scalar")
    with pytest.raises(ValueError, match="float32"):
        k.k.linear(np.zeros((2, 3), np.uint16), "BF16", np.zeros((1, 3), np.float64))
    with pytest.raises(ValueError, match="columns"):
        k.linear(Param(np.zeros((2, 3), np.uint16), "BF16"), np.zeros((1, 4), np.float32))
    with pytest.raises(ValueError, match="scale shape"):
        k.mxfp4_linear(np.zeros((2, 16), np.uint8), np.zeros((2, 2), np.uint8), np.zeros((1, 32), np.float32))
    with pytest.raises(ValueError, match="not available"):
        _native.Kernels("no-such-backend", 1)


def test_bad_expert_arrays_are_refused_naming_the_array():
    k = kernels("scalar").k
    e, z = expert_case(rng(6), latent=96, inter=64)
    good = [e.w1_packed, e.w1_scale, e.w2_packed, e.w2_scale, e.w3_packed, e.w3_scale]
    assert k.expert(*good, z, 4.0, 25.0).shape == (3, 96)

    def refused(index, array, match, z=z):
        arrays = list(good)
        if index is not None:
            arrays[index] = array
        with pytest.raises(ValueError, match=match):
            k.expert(*arrays, z, 4.0, 25.0)

    refused(3, np.zeros((96, 3), np.uint8), r"expert: w2 scale shape \[96, 3\] does not fit w2 \[96, 32\]")
    refused(5, np.zeros((65, 3), np.uint8), r"expert: w3 scale shape \[65, 3\]")
    refused(None, None, "expert: z must be a float32 array, got float64", z=z.astype(np.float64))
    refused(4, np.zeros((64, 96), np.uint8)[:, ::2], "expert: w3 must be C-contiguous")
    refused(2, e.w2_packed.astype(np.uint16), "expert: w2 must be a uint8 array, got uint16")
    refused(1, e.w1_scale[None], "expert: w1 scale must have 2 dimensions, got 3")
    refused(0, np.zeros((64, 64), np.uint8), "expert: z has 96 columns, w1 128")
    refused(4, e.w3_packed[:63], "expert: w3 has 63 rows, w1 64")
    refused(2, np.zeros((96, 48), np.uint8), r"expert: SiTU-GLU\(w1 z, w3 z\) has 64 columns, w2 96")


@pytest.mark.skipif(__import__("platform").machine() != "x86_64", reason="sets MXCSR through glibc's x86-64 fenv_t")
def test_kernels_refuse_to_run_with_flush_to_zero_on():
    import ctypes

    libm = ctypes.CDLL("libm.so.6")
    env = ctypes.create_string_buffer(32)  # glibc x86-64 fenv_t; MXCSR is the u32 at offset 28
    assert libm.fegetenv(env) == 0
    saved = env.raw
    mxcsr = int.from_bytes(env.raw[28:32], "little") | (1 << 15)  # FTZ
    ctypes.memmove(ctypes.addressof(env) + 28, mxcsr.to_bytes(4, "little"), 4)
    assert libm.fesetenv(env) == 0
    try:
        with pytest.raises(RuntimeError, match="flush-to-zero"):
            kernels("scalar").sigmoid(np.zeros(3, np.float32))
    finally:
        restore = ctypes.create_string_buffer(saved, 32)
        libm.fesetenv(restore)
    assert kernels("scalar").sigmoid(np.zeros(1, np.float32))[0] == 0.5
