"""The FMA probe's timing: every share of the probe that `k3 bench kernels` and `k3 bench prefill` print rests on it."""
from k3core import _native
from k3core.machine import rates


class FakeCore:
    """A clock and an FMA probe whose calls take `per_round` seconds a round (0 below `resolution` rounds: a coarse
    clock)."""

    def __init__(self, per_round, resolution=0):
        self.now, self.per_round, self.resolution, self.calls = 0.0, per_round, resolution, []

    def clock(self):
        return self.now

    def probe(self, name, rounds):
        self.calls.append(rounds)
        if rounds >= self.resolution:
            self.now += rounds * self.per_round
        return rounds * 12 * 8


def test_probe_rounds_grow_until_one_call_takes_the_probe_time(monkeypatch):
    core = FakeCore(per_round=2.3e-8)  # an AVX-512 round on a ~40 G/s core: 200,000 rounds are 4.6 ms
    monkeypatch.setattr(_native, "fma_probe", core.probe)
    rounds = rates.probe_rounds("avx512", clock=core.clock)
    assert rounds * core.per_round >= rates.PROBE_CALL_SECONDS
    assert rounds * core.per_round < 16 * rates.PROBE_CALL_SECONDS
    assert rates.PROBE_CALL_SECONDS >= 0.02


def test_probe_rounds_end_on_a_clock_that_reads_zero_for_short_calls(monkeypatch):
    core = FakeCore(per_round=1e-9, resolution=50_000)
    monkeypatch.setattr(_native, "fma_probe", core.probe)
    rounds = rates.probe_rounds("scalar", clock=core.clock)
    assert rounds * core.per_round >= rates.PROBE_CALL_SECONDS and len(core.calls) < 20


def test_measure_fma_times_only_calls_of_the_calibrated_length(monkeypatch):
    core = FakeCore(per_round=0.0)
    monkeypatch.setattr(_native, "fma_probe", core.probe)
    monkeypatch.setattr(rates, "probe_rounds", lambda name: 7_654_321)
    rows = rates.measure_fma(["avx512"], [1, 2], 0.01)
    assert [r["threads"] for r in rows] == [1, 2]
    assert core.calls and set(core.calls) == {7_654_321}
