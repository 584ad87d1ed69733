"""k3core/machine/cost.py and routing.py: the real model's expert unions from its routing trace, and the
projection's arithmetic (bytes, layouts by RAM, speculative passes). No timing."""
from pathlib import Path

import numpy as np
import pytest

from k3core.errors import InputError
from k3core.machine.cost import (K3_HEAD_BYTES, K3_LAYER_BYTES, K3_LAYERS, K3_TRUNK_BYTES, K3_UNION, PLANES_RATIO,
                               RAM_BESIDES_TRUNK, RING_BYTES, TOKEN_EXPERT_BYTES, Drafts, Layout, Machine, fastest,
                               layout_for, pass_cost, per_token, ram_row, union_ratio)
from k3core.machine.routing import last_forward, union_ratios

TRACE = Path(__file__).parents[1] / "fixtures" / "k3-in-c" / "expert_trace.bin"
MACHINE = Machine(7e9, 16, 3.63e9, 8.2e9)


def test_the_real_traces_unions_are_issue_26s_and_the_built_in_table():
    experts = last_forward(TRACE)
    assert experts.shape == (92, 12, 16)  # the last of 8 full-recompute forwards: every position
    ratios = union_ratios(experts)
    assert [round(ratios[t - 1], 2) for t in (1, 2, 4, 5, 9)] == [1.0, 1.66, 2.76, 3.25, 5.18]
    assert ratios == pytest.approx(K3_UNION, abs=5e-4)


def test_the_union_between_whole_rows_is_linear():
    assert union_ratio(1) == 1.0 and union_ratio(9) == K3_UNION[8] and union_ratio(12) == K3_UNION[11]
    assert union_ratio(8.5) == pytest.approx((K3_UNION[7] + K3_UNION[8]) / 2)


def test_a_trace_that_is_not_whole_positions_is_refused(tmp_path):
    bad = tmp_path / "t.bin"
    np.array([[1, 5], [1, 6], [2, 7]], "<i4").tofile(bad)  # layer 1 has two experts, layer 2 one
    with pytest.raises(InputError, match="not 2 layers × top-2"):
        last_forward(bad, top_k=2)
    (tmp_path / "odd.bin").write_bytes(b"123")
    with pytest.raises(InputError, match="not a routing trace"):
        last_forward(tmp_path / "odd.bin")


def test_a_serial_token_and_a_k8_pass_read_what_issue_26_says():
    streamed = Layout(PLANES_RATIO)  # 8 GB: the whole trunk streams
    serial, k8 = pass_cost(streamed, MACHINE, 1), pass_cost(streamed, MACHINE, 9)
    trunk = (K3_TRUNK_BYTES + K3_HEAD_BYTES) * PLANES_RATIO
    assert serial["bytes_read"] - trunk == pytest.approx(25.83e9, rel=1e-3)  # every expert read: no hits
    assert k8["bytes_read"] - trunk == pytest.approx(133.8e9, rel=1e-3)       # the trunk once, 5.18x the experts
    assert serial["seconds"] == max(serial["disk_seconds"], serial["cpu_seconds"])


def test_layouts_pin_what_the_ram_holds_beside_the_ring():
    assert layout_for(8e9, 1.0).pinned == layout_for(8e9, PLANES_RATIO, coded=True).pinned == 0
    for ram in (32e9, 64e9):
        raw, coded = layout_for(ram, 1.0), layout_for(ram, PLANES_RATIO, coded=True)
        assert raw.pinned * K3_LAYER_BYTES + RING_BYTES <= ram - RAM_BESIDES_TRUNK
        assert (raw.pinned + 1) * K3_LAYER_BYTES + RING_BYTES > ram - RAM_BESIDES_TRUNK
        assert coded.pinned > raw.pinned and not raw.head_pinned
    whole = layout_for(128e9, 1.0)
    assert whole.pinned == K3_LAYERS and whole.head_pinned and whole.streamed == 0


def test_coded_pins_are_read_from_ram_but_restored_every_pass():
    restored, coded = Layout(PLANES_RATIO, 40), Layout(PLANES_RATIO, 40, coded=True)
    assert pass_cost(coded, MACHINE)["bytes_read"] == pass_cost(restored, MACHINE)["bytes_read"]
    assert coded.restored == K3_TRUNK_BYTES + K3_HEAD_BYTES and restored.restored == restored.streamed
    assert pass_cost(coded, MACHINE)["cpu_seconds"] > pass_cost(restored, MACHINE)["cpu_seconds"]
    assert Layout(1.0).restored == 0


def test_a_speculative_token_is_its_pass_over_its_tokens_and_the_fastest_k_wins():
    drafts = [Drafts(1, 1.8, 2.0), Drafts(8, 6.8, 8.1)]
    one = per_token(Layout(1.0), MACHINE, drafts[1])
    assert one["seconds_per_token"] == pytest.approx(one["seconds"] / 6.8)
    assert one["bytes_per_token"] == pytest.approx(one["bytes_read"] / 6.8)
    best = fastest([Layout(1.0), Layout(PLANES_RATIO)], MACHINE, drafts)
    assert best["k"] == 8 and best["layout"].startswith("planes")
    row = ram_row(128e9, MACHINE, {"plain": [Drafts(1, 1.05, 1.9)]})
    # where the whole trunk is pinned, a pass costs its experts: drafts that rarely land cost more than they give
    assert row["speculation"]["plain"]["seconds_per_token"] > row["raw"]["seconds_per_token"]
    assert row["raw"]["bytes_per_token"] == pytest.approx(TOKEN_EXPERT_BYTES)
