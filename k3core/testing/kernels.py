"""Conformance checks of a kernel backend: the scalar backend's bits on every case of the kernel table
(kernel_cases.py) at 1, 2 and 5 threads, each token of a batch its single-token bits, and ids and logit
bytes identical to scalar on generated models. A backend that says it is not bit-exact (`bit_exact =
False`: only the numpy reference) is held to the cases without exp/tanh and to identical ids."""
from __future__ import annotations

import numpy as np

from ..hookspecs import hookimpl
from ..interfaces import KERNEL_FAMILIES, default_threads
from ..plugin_manager import choose_kernels, get_plugin_manager
from . import models
from .checks import Check, CheckFailed, expect
from .engines import greedy_run
from .kernel_cases import THREADS, batch_cases, kernel_cases, same


def offering(backend):
    """An in-process plugin that offers `backend` through k3_kernel_backends."""
    class Offer:
        @hookimpl
        def k3_kernel_backends(self):
            return [backend]
    return Offer()


def scalar():
    return choose_kernels(get_plugin_manager(), "scalar").item


DRAFT_KERNELS = ("int8_linear", "int4_linear")


def kernel_checks(backend) -> list[Check]:
    """Every check of the kernel backend instance `backend`."""
    who = f"kernel backend {backend.name!r}"
    exact = getattr(backend, "bit_exact", True)
    drafts = getattr(backend, "has_draft_kernels", False)  # the optional ones: only a draft model runs them

    @np.errstate(all="ignore")  # the adversarial inputs overflow and make NaNs on purpose
    def matches_scalar():
        ref = scalar()
        cases = [c for c in kernel_cases() if (exact or not c.uses_libm) and (drafts or c.kernel not in DRAFT_KERNELS)]
        want = [c.call(ref) for c in cases]
        caps = {family: 1 + i % 3 for i, family in enumerate(KERNEL_FAMILIES)}  # per-family thread caps, below 5
        try:
            for threads, capped in [(t, False) for t in THREADS] + [(max(THREADS), True)]:
                backend.set_threads(threads)
                for family, cap in caps.items():
                    backend.set_family_threads(family, cap if capped else 0)
                for case, w in zip(cases, want):
                    if not same(case.call(backend), w):
                        how = f", families capped {caps}" if capped else ""
                        raise CheckFailed(f"{case.name}, {threads} thread(s){how}: not the scalar backend's bits")
        finally:
            backend.set_threads(default_threads())
            for family in KERNEL_FAMILIES:
                backend.set_family_threads(family, 0)

    def batch_rows_are_single_rows():
        for name, batch, single in batch_cases():
            if not drafts and name.split(",")[0] in DRAFT_KERNELS:
                continue
            rows = batch(backend)
            for t in range(rows.shape[0]):
                if not same(rows[t:t + 1], single(backend, t)):
                    raise CheckFailed(f"{name}: token {t} of the batch differs from the same token alone")

    def same_ids_as_scalar():
        for shape in ("tiny", "small"):
            want = greedy_run(models.model(shape), kernels="scalar")
            got = greedy_run(models.model(shape), plugins=[offering(backend)], kernels=backend.name)
            expect(got[0] == want[0], f"{shape} model: ids {got[0]} instead of scalar's {want[0]}")
            expect(not exact or got[1] == want[1], f"{shape} model: the logit bytes differ from scalar's")

    scope = "every case of the kernel table" if exact else "the kernel-table cases without exp/tanh (bit_exact=False)"
    return [Check(f"{who}: the scalar backend's bits on {scope}, at {', '.join(map(str, THREADS))} threads and with "
                  "each kernel family's threads capped",
                  matches_scalar),
            Check(f"{who}: each token of a batch gets its single-token bits", batch_rows_are_single_rows),
            Check(f"{who}: ids" + (" and logit bytes" if exact else "") + " identical to scalar on generated models",
                  same_ids_as_scalar)]
