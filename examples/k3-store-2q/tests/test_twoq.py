"""The 2Q store against k3's conformance kit, its policy on hand-made traces, and a deliberately broken
variant (a slot served for the wrong layer) that the kit must fail, naming the check."""
from dataclasses import replace

import pytest
from k3core.testing import CheckFailed, expert_store_checks, run_checks

from k3_store_2q import TwoQPolicy, TwoQStore


@pytest.mark.parametrize("check", expert_store_checks(TwoQStore), ids=str)
def test_the_store_conforms(check):
    check()


@pytest.mark.parametrize("options", [{"a1in_fraction": 1.0}, {"a1in_fraction": 0.1, "ghost_fraction": 2.0}])
def test_it_conforms_with_other_options_too(options):
    failed = [r for r in run_checks(expert_store_checks(TwoQStore, options)) if not r.passed]
    assert not failed, failed


def test_a_scan_does_not_flush_the_experts_used_twice():
    policy = TwoQPolicy(4, a1in_fraction=0.25, ghost_fraction=1.0)
    hot = [(1, 0), (1, 1)]
    for key in hot + [(1, e) for e in range(10, 14)]:  # the hot pair is pushed out of A1in, into the ghosts
        assert policy.access(key) == (False, None) or key[1] >= 12
    for key in hot:  # seen again while a ghost: a miss, and promoted to Am
        assert policy.access(key)[0] is False
    for e in range(20, 40):  # a long scan of experts used once churns A1in only
        policy.access((1, e))
    assert [policy.access(key)[0] for key in hot] == [True, True]  # TRUE hits: still resident
    assert len(policy.a1in) + len(policy.am) == 4 and policy.evictions == 24


def test_lru_loses_the_same_experts_to_the_same_scan():
    from k3core.plugin_api import LRUPolicy

    policy = LRUPolicy(4)
    for key in [(1, 0), (1, 1)] * 2 + [(1, e) for e in range(20, 40)]:
        policy.access(key)
    assert [policy.access(key)[0] for key in [(1, 0), (1, 1)]] == [False, False]


def test_unknown_or_mistyped_options_are_refused_by_name():
    from k3core import EngineConfig, memory_plan
    from k3core.errors import UsageError
    from k3core.testing.models import model
    from k3core.testing.stores import offering

    with pytest.raises(UsageError, match="has no option 'a1in'; its options are: direct_io .*a1in_fraction"):
        memory_plan(EngineConfig(model("tiny"), expert_store="twoq", store_options={"a1in": 0.5}),
                    plugins=[offering(TwoQStore)])
    with pytest.raises(UsageError, match="a1in_fraction must be float"):
        memory_plan(EngineConfig(model("tiny"), expert_store="twoq", store_options={"a1in_fraction": "half"}),
                    plugins=[offering(TwoQStore)])


class StaleTwoQ(TwoQStore):
    """Broken on purpose: experts are looked up by number only, so layer L+1 is served layer L's slot."""

    name = "twoq-stale"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.by_number = {}

    def fetch(self, layer, experts):
        out = []
        for e in experts:
            held = self.by_number.get(int(e))
            out.append(replace(held, layer=layer) if held is not None else super().fetch(layer, [e])[0])
            self.by_number[int(e)] = out[-1]
        return out


def test_the_kit_fails_a_store_that_serves_a_stale_slot():
    results = {r.name: r for r in run_checks(expert_store_checks(StaleTwoQ))}
    bytes_check = next(r for name, r in results.items() if "serves each expert's own bytes" in name)
    assert not bytes_check.passed and "not that expert's bytes" in bytes_check.detail
    ids_check = next(r for name, r in results.items() if "identical to the lru store" in name)
    assert not ids_check.passed
    with pytest.raises(CheckFailed, match="stale or shared slot"):
        expert_store_checks(StaleTwoQ)[0]()
