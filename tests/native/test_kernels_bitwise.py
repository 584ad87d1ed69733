"""Every native kernel on every backend this machine runs gives the scalar backend's bytes on the
kernel table (k3core/testing/kernel_cases.py: random, adversarial and lane-order-revealing inputs) at
1, 2 and 5 threads; a batch of tokens gives each token its single-token bytes; the numpy reference
equals the C++ scalar backend wherever no transcendental function is involved (both implement
docs/NUMERICS.md); and the special cases and argument checks hold."""
import numpy as np
import pytest

from k3core import _native
from k3core.interfaces import Param
from k3core.plugins.native_kernels import NativeKernels
from k3core.plugins.reference_kernels import ReferenceKernels
from k3core.testing.kernel_cases import (THREADS, activations, batch_cases, bf16_weights, expert_case, mxfp4_weights,
                                         kernel_cases, rng, same)

BACKENDS = _native.available_backends()
SIMD = [b for b in BACKENDS if b != "scalar"]
CASES = kernel_cases()
KERNELS = sorted({c.kernel for c in CASES})


def kernels(name, threads=1):
    k = NativeKernels(name)
    k.set_threads(threads)
    return k


@pytest.mark.parametrize("backend", SIMD)
@pytest.mark.parametrize("kernel", KERNELS)
def test_every_case_of_the_table_matches_scalar(backend, kernel):
    cases = [c for c in CASES if c.kernel == kernel]
    want = [c.call(kernels("scalar")) for c in cases]
    for threads in THREADS:
        k = kernels(backend, threads)
        for case, w in zip(cases, want):
            assert same(case.call(k), w), (backend, case.name, threads)


def test_the_table_reaches_every_kernel_and_every_lane_order_case():
    from k3core.interfaces import kernel_names

    assert set(KERNELS) == set(kernel_names())  # the draft kernels too, which are not abstract (a default)
    assert sum("lane order" in c.name for c in CASES) >= 10 and sum("cancelling" in c.name for c in CASES) >= 100
    for kernel in ("int8_linear", "int4_linear"):
        names = [c.name for c in CASES if c.kernel == kernel]
        assert all(any(f"T={t}" in n for n in names) for t in (1, 2, 3, 4, 5, 17, 33)), kernel


def test_int4_padding_is_never_read():
    """Columns past `cols` in the last group hold whatever the bytes say, and that group's scale may be infinite:
    the product is the one of the same matrix with clean padding."""
    r = rng(13)
    for cols in (1, 17, 33, 63):
        packed = r.integers(0, 256, (6, -(-cols // 32) * 16), dtype=np.uint8)
        scales = r.uniform(0.01, 0.1, (6, packed.shape[1] // 16)).astype(np.float32)
        x = activations(r, (3, cols))
        clean = packed.copy()
        last = packed.shape[1] - 16  # the last group's first byte; its column 2k: the low nibble of byte k
        for c in range(cols % 32 or 32, 32):
            byte = clean[:, last + c // 2]
            clean[:, last + c // 2] = (byte & 0x0F) | 0x80 if c % 2 else (byte & 0xF0) | 0x08  # nibble 8: code 0
        want = ReferenceKernels().int4_linear(clean, scales, cols, x)
        assert not np.isnan(want).any()
        for k in [ReferenceKernels(), *(kernels(b) for b in BACKENDS)]:
            assert same(k.int4_linear(packed, scales, cols, x), want), (k.name, cols)
        if cols % 32:
            dirty = scales.copy()
            dirty[:, -1] = np.inf  # the padded group's real columns now give inf or NaN, its padding nothing
            assert same(kernels("scalar").int4_linear(packed, dirty, cols, x),
                        ReferenceKernels().int4_linear(clean, dirty, cols, x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batch_gives_each_token_its_single_token_bytes(backend):
    k = kernels(backend, 2)
    for name, batch, single in batch_cases():
        rows = batch(k)
        for t in range(rows.shape[0]):
            assert same(rows[t:t + 1], single(k, t)), (name, t)


def test_the_numpy_reference_equals_scalar_wherever_no_libm_is_involved():
    ref, cpp = ReferenceKernels(), kernels("scalar")
    for case in CASES:
        if not case.uses_libm:
            assert same(case.call(ref), case.call(cpp)), case.name


@pytest.mark.parametrize("backend", BACKENDS)
def test_changing_the_thread_count_of_a_used_backend_keeps_its_bits(backend):
    """New workers of a resized pool must not wake for the job before (it used to crash)."""
    r = rng(11)
    w, x = Param(bf16_weights(r, 512, 256), "BF16"), activations(r, (64, 256))  # big enough to use every thread
    k = kernels(backend, 2)
    want = k.linear(w, x)
    for threads in (5, 1, 3, 2, 4):
        k.set_threads(threads)
        k.sigmoid(x)  # another call in between: the job before is long gone
        assert same(k.linear(w, x), want), threads


def test_cpp_scalar_equals_the_numpy_reference_on_plain_inputs():
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
    x = np.zeros((1, 40), np.float32)
    with pytest.raises(ValueError, match=r"int8_linear: scales has 3 values, codes 2 rows"):
        k.int8_linear(np.zeros((2, 40), np.int8), np.ones(3, np.float32), x)
    with pytest.raises(ValueError, match="int8_linear: codes must be a int8 array, got uint8"):
        k.k.int8_linear(np.zeros((2, 40), np.uint8), np.ones(2, np.float32), x)
    with pytest.raises(ValueError, match=r"int4_linear: packed \[2, 16\] does not hold 40 columns: .* 2 groups of 16"):
        k.int4_linear(np.zeros((2, 16), np.uint8), np.ones((2, 2), np.float32), 40, x)
    with pytest.raises(ValueError, match=r"int4_linear: scales \[2, 1\] does not fit packed \[2, 32\]"):
        k.int4_linear(np.zeros((2, 32), np.uint8), np.ones((2, 1), np.float32), 40, x)
    with pytest.raises(ValueError, match="int4_linear: x has 40 columns, the weight 33"):
        k.int4_linear(np.zeros((2, 32), np.uint8), np.ones((2, 2), np.float32), 33, x)


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


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_over_a_long_context_scores_its_heads_in_blocks_with_each_heads_own_bits(backend):
    """Past 8 MiB of scores (block x positions doubles) mqa_attention takes its heads a block at a time: 9 heads over
    120,000 positions run as 8 and 1. Each head gives the bits it gives alone, on one thread and two."""
    r = rng(17)
    q, keys, values = activations(r, (9, 8)), activations(r, (120_000, 8)), activations(r, (120_000, 8))
    alone = np.concatenate([kernels(backend).mqa_attention(q[h:h + 1], keys, values, 0.35) for h in range(9)])
    for threads in (1, 2):
        assert same(kernels(backend, threads).mqa_attention(q, keys, values, 0.35), alone), threads
