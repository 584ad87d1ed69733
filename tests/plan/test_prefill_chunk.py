"""The prefill chunk: plan/prefill.py's cost of a prompt, the chunk `auto` picks, and that the ids never depend on
it (issue 39)."""
from __future__ import annotations

import numpy as np
import pytest

from k3core import EngineConfig, generate_ids, memory_plan, open_engine
from k3core.errors import UsageError
from k3core.plan import prefill
from k3core.plan.prefill import K3, K3_UNION, Rates, Where

C_ENGINE_MACHINE = Rates(disk=7e9, cores=16, macs_per_core=27e9)
STREAMED_8GB = Where(trunk_streamed=K3.trunk_bytes - 3e9)  # the laptop preset: all but 3 GB of the trunk streams


def test_the_union_is_the_trace_up_to_twelve_then_grows_to_every_expert():
    assert [prefill.union_ratio(t) for t in range(1, 13)] == pytest.approx(K3_UNION)
    past = [prefill.union(t, 896, 16) for t in range(12, 400)]
    assert all(b >= a for a, b in zip(past, past[1:])) and past[0] == pytest.approx(16 * K3_UNION[-1])
    assert 0 < prefill._exponent(K3_UNION) < 1
    assert prefill.union(512, 896, 16) == 896  # a 512-id chunk of the real model reads every expert


def test_a_chunk_amortises_its_reads_until_compute_binds():
    at = {n: prefill.per_id(K3, STREAMED_8GB, C_ENGINE_MACHINE, n) for n in (512, 1024, 4096, 65536)}
    assert at[512] > at[1024] > at[4096] > at[65536]
    compute = K3.macs_per_id / (C_ENGINE_MACHINE.cores * C_ENGINE_MACHINE.macs_per_core)
    assert at[65536] == pytest.approx(compute, rel=0.05)


def test_attention_runs_at_its_own_rate():
    """A pass's CPU seconds: its weights' multiply-adds at macs_per_core, its attention pairs' at the attention rate
    (ATTENTION_RATIO of macs_per_core unless given)."""
    rows, start = 1024, 29_000
    pairs = (rows * start + rows * (rows + 1) / 2) * K3.macs_per_pair
    weights = rows * K3.macs_per_id / C_ENGINE_MACHINE.macs_per_core
    for rates, attention in ((C_ENGINE_MACHINE, prefill.ATTENTION_RATIO * 27e9),
                             (Rates(7e9, 16, 27e9, attention_macs_per_core=5e9), 5e9)):
        cpu = prefill.pass_seconds(K3, Where(0.0, 0.0), rates, rows, start)["cpu_seconds"]
        assert cpu == pytest.approx((weights + pairs / attention) / 16)
    assert 0 < prefill.ATTENTION_RATIO < 1


def test_auto_at_8gb_projects_at_least_1_3x_faster_per_prompt_id_than_512():
    choice = prefill.choose_chunk(K3, STREAMED_8GB, C_ENGINE_MACHINE, prefill.most_rows(K3, 8e9))
    assert choice.chunk > 512 and choice.chunk <= choice.most
    assert choice.default_seconds_per_id / choice.seconds_per_id >= 1.3
    assert "memory allows" in choice.why


def test_with_nothing_read_longer_chunks_buy_nothing_and_auto_keeps_512():
    choice = prefill.choose_chunk(K3, Where(0.0, 0.0), C_ENGINE_MACHINE, 60_000)
    assert choice.chunk == 512 and "no faster" in choice.why


def test_the_memory_bounds_the_chunk():
    assert prefill.most_rows(K3, 8e9) * K3.activation_bytes <= 8e9 * prefill.CHUNK_SHARE
    assert prefill.most_rows(K3, 8e9, left=100e6) * K3.activation_bytes <= 100e6
    assert prefill.choose_chunk(K3, STREAMED_8GB, C_ENGINE_MACHINE, 600).chunk == 512


def test_a_cached_prefix_costs_only_the_rest_and_attention_grows_with_position():
    cold = prefill.prompt_seconds(K3, STREAMED_8GB, C_ENGINE_MACHINE, 1024, 30_000)
    cached = prefill.prompt_seconds(K3, STREAMED_8GB, C_ENGINE_MACHINE, 1024, 30_000, 29_000)
    late = prefill.pass_seconds(K3, STREAMED_8GB, C_ENGINE_MACHINE, 1000, 29_000)["seconds"]
    assert cached == pytest.approx(late) and cold > 20 * cached
    assert late > prefill.pass_seconds(K3, STREAMED_8GB, C_ENGINE_MACHINE, 1000, 0)["seconds"]


def test_the_shape_of_a_checkpoint_counts_its_own_experts_and_mla_layers(wide_shape):
    c, shape = wide_shape
    mla = sum(c.attention_kind(L) == "mla" for L in range(c.num_hidden_layers))
    assert shape.macs_per_pair == mla * c.num_attention_heads * (2 * c.kv_lora_rank + c.qk_rope_head_dim)
    assert shape.experts == c.num_experts and shape.top_k == c.num_experts_per_token


@pytest.fixture
def wide_shape(tiny_model):
    from k3core.format.checkpoint import open_checkpoint

    ck = open_checkpoint(tiny_model)
    try:
        return ck.config, prefill.Shape.of_checkpoint(ck)
    finally:
        ck.close()


def test_auto_is_chosen_at_plan_time_and_the_plan_says_why(tiny_model):
    plan = memory_plan(EngineConfig(tiny_model, prefill_chunk="auto"))
    row = next(r for r in plan.rows if r.item == "prefill chunk")
    assert "auto:" in row.detail and "memory allows" in row.detail
    with open_engine(EngineConfig(tiny_model, prefill_chunk="auto")) as engine:
        assert isinstance(engine.prefill_chunk, int) and engine.prefill_chunk >= 512
        assert engine.config_in.prefill_chunk == engine.prefill_chunk


def test_a_bad_chunk_is_refused_by_name(tiny_model):
    with pytest.raises(UsageError, match="prefill_chunk"):
        EngineConfig(tiny_model, prefill_chunk="fast")


def test_the_ids_do_not_depend_on_the_chunk(tiny_model):
    prompt = [int(i) for i in np.random.default_rng(5).integers(0, 256, 40)]
    out = {}
    for chunk in (1, 7, "auto"):
        with open_engine(EngineConfig(tiny_model, prefill_chunk=chunk)) as engine:
            gen = generate_ids(engine, prompt, engine.new_state())
            out[chunk] = [next(gen)[0] for _ in range(6)]
            gen.close()
    assert out[1] == out[7] == out["auto"]


def test_bench_prefill_measures_each_chunk_and_sets_the_model_beside_it(tiny_model, capsys):
    import json

    from k3core.cli.main import main

    assert main(["bench", "prefill", str(tiny_model), "--ids", "24", "--chunks", "4,8,24", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["chunk"] for r in doc["runs"]] == [4, 8, 24] and doc["fma_probe_macs_per_second"] > 0
    for r in doc["runs"]:
        assert r["seconds"] > 0 and r["predicted_seconds"] > 0 and 0 < r["share_of_fma"]
        assert r["share_of_fma"] == pytest.approx(r["macs"] / r["seconds"] / r["fma_probe_macs_per_second"])
        assert r["bytes_read"] == r["predicted_bytes"] == 0  # the tiny model's experts all fit the cache
    assert doc["runs"][0]["predicted_vs_measured"] == pytest.approx(1.0)  # the first calibrates



def test_bench_prefill_by_kernel_times_every_kernel_and_counts_products_and_attention_multiply_adds(tiny_model, capsys):
    import json

    from k3core.cli.main import main

    assert main(["bench", "prefill", str(tiny_model), "--ids", "24", "--chunks", "4,24", "--by-kernel", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    text = json.loads((tiny_model / "config.json").read_text())["text_config"]
    moe_layers = text["num_hidden_layers"] - text["first_k_dense_replace"]
    expert_macs = (24 * text["num_experts_per_token"] * moe_layers * 3 * text["routed_expert_hidden_size"]
                   * text["moe_intermediate_size"])
    mla_layers = len(text["linear_attn_config"]["full_attn_layers"])
    attention_macs = (24 * 25 // 2 * mla_layers * text["num_attention_heads"]  # position p meets p + 1 positions
                      * (2 * text["kv_lora_rank"] + text["qk_rope_head_dim"]))
    for r in doc["runs"]:
        kernels = {k["kernel"]: k for k in r["by_kernel"]}
        assert {"linear", "expert", "mqa_attention", "kda_recurrence", "rmsnorm"} <= set(kernels)
        assert kernels["expert"]["macs"] == expert_macs  # every id's routed experts, whatever the chunk
        assert kernels["mqa_attention"]["macs"] == attention_macs and kernels["rmsnorm"]["macs"] is None
        assert kernels["linear"]["macs"] > 0
        assert sum(k["seconds"] for k in r["by_kernel"]) <= r["seconds"]
        for k in r["by_kernel"]:
            assert k["share"] == pytest.approx(k["seconds"] / r["seconds"])
            if k["macs"] is not None:
                assert k["share_of_fma"] == pytest.approx(k["macs"] / k["seconds"] / r["fma_probe_macs_per_second"])
    assert main(["bench", "prefill", str(tiny_model), "--ids", "8", "--chunks", "8", "--by-kernel"]) == 0
    out = capsys.readouterr().out
    assert "chunk 8, by kernel" in out and "| expert |" in out and "| outside the kernels |" in out
    # the reference backend's expert calls its own mxfp4_linear: counted once, inside the expert
    assert main(["bench", "prefill", str(tiny_model), "--ids", "8", "--chunks", "8", "--by-kernel", "--kernels",
                 "reference", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)["runs"][0]
    kernels = {k["kernel"]: k for k in run["by_kernel"]}
    assert "mxfp4_linear" not in kernels and kernels["expert"]["macs"] == expert_macs // 3
    assert sum(k["seconds"] for k in run["by_kernel"]) <= run["seconds"]

def test_bench_prefill_refuses_bad_chunks_and_lengths_by_name(tiny_model):
    from k3core.cli.main import main

    for bad in (["--chunks", "0,8"], ["--chunks", "a,8"], ["--ids", "0"], ["--ids", str(1 << 20)]):
        assert main(["bench", "prefill", str(tiny_model), *bad]) == 2
