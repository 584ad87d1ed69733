"""A kernel backend for k3 that wraps k3's best built-in native kernels and counts every call, as a
plugin from outside: how many products, norms, recurrences a token costs, without touching a bit.

Installed, it is the default backend (an installed plugin comes before the built-ins, and k3 says so in
one line on every run); `--kernels avx512` (or any name) picks another. Only k3core.plugin_api is used.

    engine = open_engine(EngineConfig("demo-model"))     # with this package installed
    ...
    print(engine.kernels.counts)                          # {"linear": 1342, "router": 24, ...}
"""
from __future__ import annotations

from collections import Counter

from k3core.plugin_api import KernelBackend, builtin_kernels, hookimpl

__version__ = "0.1.0"


class CountingKernels(KernelBackend):
    name = "counting"
    description = "the best built-in native kernels, every call counted (example plugin)"
    bit_exact = True  # it only forwards: the wrapped backend's bits

    def __init__(self, inner: KernelBackend | None = None):
        self._inner = inner
        self.counts: Counter = Counter()

    @property
    def inner(self) -> KernelBackend:
        if self._inner is None:  # chosen on first use: building the plugin list must stay cheap
            self._inner = builtin_kernels()
        return self._inner

    def _call(self, kernel: str, *args):
        self.counts[kernel] += 1
        return getattr(self.inner, kernel)(*args)

    def set_threads(self, threads):
        self.inner.set_threads(threads)

    def set_family_threads(self, family, threads):
        self.inner.set_family_threads(family, threads)

    def linear(self, w, x):
        return self._call("linear", w, x)

    def mxfp4_linear(self, packed, scale, x):
        return self._call("mxfp4_linear", packed, scale, x)

    def expert(self, e, z, beta, linear_beta):
        return self._call("expert", e, z, beta, linear_beta)

    def rmsnorm(self, x, w, eps):
        return self._call("rmsnorm", x, w, eps)

    def l2norm_heads(self, x, heads, eps):
        return self._call("l2norm_heads", x, heads, eps)

    def situ_glu(self, g, u, beta, linear_beta):
        return self._call("situ_glu", g, u, beta, linear_beta)

    def sigmoid(self, x):
        return self._call("sigmoid", x)

    def mul_sigmoid(self, y, g):
        return self._call("mul_sigmoid", y, g)

    def short_conv(self, x, history, w):
        return self._call("short_conv", x, history, w)

    def kda_decay(self, z, a_log, dt_bias, lower_bound):
        return self._call("kda_decay", z, a_log, dt_bias, lower_bound)

    def kda_recurrence(self, q, k, v, alpha, beta, state, scale):
        return self._call("kda_recurrence", q, k, v, alpha, beta, state, scale)

    def mqa_attention(self, q, keys, values, scale):
        return self._call("mqa_attention", q, keys, values, scale)

    def router(self, logits, bias, top_k, renormalize, scaling):
        return self._call("router", logits, bias, top_k, renormalize, scaling)

    def combine(self, outputs, weights):
        return self._call("combine", outputs, weights)

    def attnres(self, sources, fold, eps):
        return self._call("attnres", sources, fold, eps)


@hookimpl
def k3_kernel_backends():
    return [CountingKernels()]
