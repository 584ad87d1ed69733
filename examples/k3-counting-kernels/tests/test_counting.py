"""The counting backend against k3's conformance kit, its counts on a real forward pass, and a
deliberately broken variant (one changed lane order in `linear`) that the kit must fail, naming the check."""
import numpy as np
import pytest
from k3core.plugin_api import Param, builtin_kernels
from k3core.testing import CheckFailed, kernel_backend_checks, kernel_cases, run_checks
from k3core.testing.kernel_cases import same

from k3_counting_kernels import CountingKernels


@pytest.mark.parametrize("check", kernel_backend_checks(CountingKernels()), ids=str)
def test_the_backend_conforms(check):
    check()


def test_it_counts_every_call_of_a_forward_pass():
    from k3core import EngineConfig, greedy_ids, open_engine
    from k3core.testing.kernels import offering
    from k3core.testing.models import model

    backend = CountingKernels()
    with open_engine(EngineConfig(model("tiny"), kernels="counting"), plugins=[offering(backend)]) as engine:
        greedy_ids(engine, [1, 2, 3], 2)
        config = engine.config
    moe_layers = config.num_hidden_layers - config.first_k_dense_replace
    assert backend.counts["router"] == 2 * moe_layers  # one routing per MoE layer per forward pass
    assert backend.counts["attnres"] > 0 and backend.counts["linear"] > backend.counts["router"]


def lane_dot_folded_backwards(w, x):
    """Σ w·x in float64 with 16 lanes (lane = i mod 16), but neighbouring lanes folded first instead of
    lane j with lane j+8 (docs/NUMERICS.md): one changed lane order."""
    acc = np.zeros((x.shape[0], w.shape[0], 16))
    for j in range(w.shape[1]):
        acc[:, :, j % 16] += x[:, None, j].astype(np.float64) * w[None, :, j].astype(np.float64)
    while acc.shape[-1] > 1:
        acc = acc[..., 0::2] + acc[..., 1::2]
    return acc[..., 0].astype(np.float32)


class BackwardsFold(CountingKernels):
    """Broken on purpose: `linear` folds its lanes in another order."""

    name = "counting-backwards-fold"

    def linear(self, w, x):
        return lane_dot_folded_backwards(Param(w.data, w.dtype).f32(), x)


def test_the_kit_fails_a_backend_with_one_changed_lane_order():
    results = run_checks(kernel_backend_checks(BackwardsFold()))
    table = next(r for r in results if "the scalar backend's bits" in r.name)
    assert not table.passed and "not the scalar backend's bits" in table.detail and "linear" in table.detail
    with pytest.raises(CheckFailed, match="linear .*not the scalar backend's bits"):
        kernel_backend_checks(BackwardsFold())[0]()
    lane_cases = [c for c in kernel_cases() if "lane order" in c.name and c.kernel == "linear"]
    broken, reference = BackwardsFold(), builtin_kernels("scalar")
    assert not all(same(c.call(broken), c.call(reference)) for c in lane_cases)  # the cases made to show it
