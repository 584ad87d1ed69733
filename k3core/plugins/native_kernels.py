"""The native kernel backends (C++ in native/): avx512, avx2, neon and scalar, best first.

Each is a thin adapter from the KernelBackend interface to k3core._native.Kernels; the numbers are
computed in C++ with the GIL released. They match each other bit for bit (docs/NUMERICS.md).
"""
from __future__ import annotations

import numpy as np

from ..plugin_api import ExpertWeights, KernelBackend, Param, default_threads, hookimpl, native

DESCRIPTIONS = {
    "avx512": "C++ AVX-512 (F/BW/VL) matrix kernels",
    "avx2": "C++ AVX2 + FMA matrix kernels",
    "neon": "C++ aarch64 NEON matrix kernels",
    "scalar": "C++ scalar: the readable definition the SIMD backends match bit for bit",
}


def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


class NativeKernels(KernelBackend):
    has_draft_kernels = True

    def __init__(self, name: str):
        self.name = name
        self.description = DESCRIPTIONS[name]
        self._k = None

    def available(self) -> bool:
        return self.name in native.available_backends()

    @property
    def k(self):
        if self._k is None:
            self._k = native.Kernels(self.name, default_threads())
        return self._k

    def set_threads(self, threads: int) -> None:
        self.k.threads = max(1, int(threads))

    def set_family_threads(self, family: str, threads: int) -> None:
        self.k.set_family_threads(family, int(threads))

    def linear(self, w: Param, x):
        return self.k.linear(np.ascontiguousarray(w.data), w.dtype, _f32(x))

    def mxfp4_linear(self, packed, scale, x):
        return self.k.mxfp4_linear(np.ascontiguousarray(packed), np.ascontiguousarray(scale), _f32(x))

    def int8_linear(self, codes, scales, x):
        return self.k.int8_linear(np.ascontiguousarray(codes), _f32(scales), _f32(x))

    def int4_linear(self, packed, scales, cols, x):
        return self.k.int4_linear(np.ascontiguousarray(packed), _f32(scales), int(cols), _f32(x))

    def expert(self, e: ExpertWeights, z, beta, linear_beta):
        return self.k.expert(e.w1_packed, e.w1_scale, e.w2_packed, e.w2_scale, e.w3_packed, e.w3_scale,
                             _f32(z), beta, linear_beta)

    def rmsnorm(self, x, w, eps):
        return self.k.rmsnorm(_f32(x), None if w is None else _f32(w), eps)

    def l2norm_heads(self, x, heads, eps):
        return self.k.l2norm_heads(_f32(x), heads, eps)

    def situ_glu(self, g, u, beta, linear_beta):
        return self.k.situ_glu(_f32(g), _f32(u), beta, linear_beta)

    def sigmoid(self, x):
        return self.k.sigmoid(_f32(x))

    def mul_sigmoid(self, y, g):
        return self.k.mul_sigmoid(_f32(y), _f32(g))

    def short_conv(self, x, history, w):
        return self.k.short_conv(_f32(x), _f32(history), _f32(w))

    def kda_decay(self, z, a_log, dt_bias, lower_bound):
        return self.k.kda_decay(_f32(z), _f32(a_log), _f32(dt_bias), lower_bound)

    def kda_recurrence(self, q, k, v, alpha, beta, state, scale):
        return self.k.kda_recurrence(_f32(q), _f32(k), _f32(v), _f32(alpha), _f32(beta), _f32(state), scale)

    def mqa_attention(self, q, keys, values, scale):
        return self.k.mqa_attention(_f32(q), _f32(keys), _f32(values), scale)

    def router(self, logits, bias, top_k, renormalize, scaling):
        return self.k.router(_f32(logits), _f32(bias), top_k, renormalize, scaling)

    def combine(self, outputs, weights):
        return self.k.combine([_f32(o) for o in outputs], _f32(weights))

    def attnres(self, sources, fold, eps):
        return self.k.attnres([_f32(s) for s in sources], np.ascontiguousarray(fold, dtype=np.float64), eps)


@hookimpl(trylast=True)
def k3_kernel_backends():
    return [NativeKernels(name) for name in ("avx512", "avx2", "neon", "scalar")]
