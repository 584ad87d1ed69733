"""`k3 bench kernels --quick`: the JSON document's structure, every measured number positive, the
table's target marks and bad usage. Tiny shapes; no timing assertions."""
import json
import sys

import pytest

from k3core import _native
from k3core.cli.main import main

BENCHES = {"bf16_t1", "mxfp4_t1", "bf16_t1_hot", "mxfp4_t1_hot", "experts",
           *(f"{k}_t{t}" for k in ("bf16", "mxfp4") for t in (2, 4, 8, 16, 64)),
           *(f"draft_{k}_t{t}" for k in ("int8", "int4") for t in (1, 64)), "mla_attention"}


def numbers(node, path=""):
    """(path, value) of every int/float in a JSON tree; background_* fields may be 0 or null."""
    if isinstance(node, dict):
        for k, v in node.items():
            if not k.startswith("background"):
                yield from numbers(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from numbers(v, f"{path}[{i}]")
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield path, node


def test_quick_json_has_every_cell_and_only_positive_numbers(capsys):
    assert main(["bench", "kernels", "--quick", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    m = doc["machine"]
    assert m["cores"] >= 1 and m["backends"] == _native.available_backends() and "flags" in m["build"]
    backends, threads = doc["settings"]["backends"], doc["settings"]["threads"]
    assert backends == m["backends"] and threads[0] == 1 and doc["settings"]["quick"] is True
    assert [p["threads"] for p in doc["probe"]["rows"]] == threads
    fma_cells = [(f["backend"], f["threads"]) for f in doc["fma_probe"]["rows"]]
    assert fma_cells == [(b, t) for b in backends for t in threads]
    assert set(doc["benches"]) == BENCHES
    for key in BENCHES:
        rows = [r for r in doc["results"] if r["bench"] == key]
        baseline = [] if key.endswith("_hot") else [("numpy", None)]  # in-cache cells have no numpy row
        assert [(r["backend"], r["threads"]) for r in rows] == baseline + [(b, t) for b in backends for t in threads]
        for r in rows[len(baseline):]:
            assert {"gbps", "gbps_per_core", "tokens_per_s", "vs_numpy", "vs_probe", "vs_fma", "median_s",
                    "min_s"} <= set(r)
            assert r["min_s"] <= r["median_s"] and r["reps"] >= 3
            if key in ("bf16_t1", "mxfp4_t1"):
                assert len(r["targets"]) == 2 and all(isinstance(v, bool) for v in r["targets"].values())
    bad = [(p, v) for p, v in numbers(doc) if not v > 0]
    assert not bad, bad


def test_quick_table_prints_targets_beside_the_numbers(capsys):
    assert main(["bench", "kernels", "--quick", "--backends", "scalar", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "memory-read probe" in out and "MXFP4 GEMV T=1" in out and "16-expert" not in out
    assert "GB/s/core>=10" in out and "probe>=60%" in out and "numpy>=3x" in out
    assert "FMA probe" in out and "%FMA" in out


def test_bad_usage_exits_2(capsys):
    assert main(["bench", "kernels", "--quick", "--backends", "nosuch"]) == 2
    assert "nosuch" in capsys.readouterr().err
    assert main(["bench", "kernels", "--quick", "--threads", "0"]) == 2
    assert main(["bench"]) == 2


def test_bench_decode_runs_every_row_with_identical_ids(capsys, tiny_model, tmp_path):
    code = main(["bench", "decode", str(tiny_model), "--trunk", str(tmp_path / "trunk"), "--gen", "4", "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in doc["runs"]}
    assert "error" not in str(list(rows.values()))
    assert set(rows) >= {"serial", "replay oracle K=4", "replay wrong K=4", "replay wrong auto", "batch of 8"}
    serial = rows["serial"]
    for name, r in rows.items():
        if not name.startswith(("batch", "serial, ", "ngram")):
            assert r["ids"] == serial["ids"], name
    assert rows["replay oracle K=4"]["forward_passes"] == 2 < serial["forward_passes"] == 4
    assert rows["replay oracle K=4"]["draft_accepted"] == 3
    assert [len(ids) for ids in rows["batch of 8"]["ids"]] == [4] * 8
    assert rows["batch of 8"]["bytes_read_per_token"] < serial["bytes_read_per_token"]  # one pass serves 8


def test_bench_drafts_reports_acceptance_on_the_demo_model(capsys):
    assert main(["bench", "drafts", "--gen", "20", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {r["run"] for r in rows} == {"serial", "ngram K=4", "ngram auto"}
    assert all(r["identical"] for r in rows)
    assert sum(r["drafted"] for r in rows) > 0


def test_bench_codec_reports_ratio_bound_and_speed(capsys, tiny_model, tmp_path):
    trunk = tmp_path / "trunk"
    assert main(["bench", "codec", str(tiny_model), "--trunk", str(trunk), "--all", "--block", "65536",
                 "--seconds", "0.05", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["blocks"] >= 10 and doc["raw_bytes"] == 65536 * doc["blocks"]
    assert 0.5 < doc["bound_per_block"] < 1 and 0.5 < doc["payload_ratio"] <= doc["ratio"] < 1
    assert doc["decode_gbps_one_core"] > 0 and doc["decode_gbps_all"] > 0 and doc["encode_gbps"] > 0
    assert main(["bench", "codec", str(trunk), "--block", "65536", "--seconds", "0.05"]) == 0
    assert "order-0 bound, per block" in capsys.readouterr().out
    assert main(["bench", "codec", str(tiny_model)]) == 2  # a checkpoint needs --trunk
    assert "give --trunk DIR" in capsys.readouterr().err


def test_bench_stream_compares_two_trunks_against_the_disk_floor(capsys, tiny_model, tmp_path):
    from k3core.io.pack import pack

    raw, coded = tmp_path / "raw", tmp_path / "coded"
    pack(tiny_model, raw)
    pack(tiny_model, coded, codec="planes", block_bytes=65536)
    assert main(["bench", "stream", str(tiny_model), "--trunk", str(raw), "--compare-trunk", str(coded),
                 "--compare-store-option", "prefetch=false", "--budgets", "0.002:0", "--gen", "2",
                 "--probe-seconds", "0.1", "--prompt-length", "24", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    first, second, third = doc["runs"]
    assert all(r["prompt_ids"] == 24 and r["prefill_io"]["bytes_read"] > 0 for r in doc["runs"])
    assert 0 <= first["prefill_io"]["io_share"] <= 1 and 0 <= first["prefill_io"]["hidden"] <= 1
    assert (first["trunk_codec"], second["trunk_codec"]) == ("raw", "planes"), doc["runs"]
    assert third["options"] == ["prefetch=false"] and third["expert_prefetched"] == 0
    assert first["expert_prefetched"] > 0 and third["vs_first_run_seconds_per_token"] > 0
    assert second["vs_first_run_seconds_per_token"] > 0 and first["disk_floor_seconds_per_token"] > 0
    # a coded ring slot holds its layer's stored bytes too (in place), so on this tiny model the raw pack pins
    # more layers at the same budget; what each streamed layer costs is its stored bytes
    assert second["trunk_bytes_read"] > 0 and second["pinned_layers"] <= first["pinned_layers"]
    from k3core.cli.bench.stream import stream_table
    table = stream_table(doc)
    assert "| raw |" in table and "| planes |" in table and "| raw, prefetch=false |" in table and "× floor" in table
    assert doc["raw_o_direct_probe_busy"]["rate"] > 0 and "vs busy probe" in table and "while every core computes" in table
    small = doc["raw_o_direct_probe_small_pages"]
    assert small["rate"] > 0 and not small["huge_pages"] and doc["raw_o_direct_probe"]["huge_pages"]
    assert "into 4 KB pages instead of huge ones" in table
    assert "| disk busy | disk while busy, vs probe |" in table and all("disk_activity" in r for r in doc["runs"])
    assert "| prefill I/O share | prefill reads hidden |" in table


def test_bench_stream_refuses_a_prompt_length_past_its_limit_before_anything_runs(capsys, tiny_model, tmp_path):
    assert main(["bench", "stream", str(tiny_model), "--trunk", str(tmp_path / "trunk"), "--prompt-length", "0"]) == 2
    assert "--prompt-length takes 1..65536 ids, got 0" in capsys.readouterr().err
    assert not (tmp_path / "trunk").exists()  # nothing packed


def test_the_real_model_projection_adds_up():
    from k3core.cli.bench.stream import projections
    from k3core.machine.cost import Drafts, K3_HEAD_BYTES, K3_TRUNK_BYTES, TOKEN_EXPERT_BYTES, projection

    stream, experts = K3_TRUNK_BYTES + K3_HEAD_BYTES, TOKEN_EXPERT_BYTES
    raw = projection(1.0, 1.0, 10e9, 1.2, 8)
    assert raw["bytes_read_per_token"] == pytest.approx(stream + experts)  # one token's experts: no hits
    assert raw["cpu_seconds"] == pytest.approx((stream + experts) / 10e9 / 8)  # no decoding for a raw trunk
    assert raw["seconds_per_token"] == pytest.approx(max(raw["disk_seconds"], raw["cpu_seconds"]) * 1.2)
    coded = projection(0.7, 2e9, 10e9, 1.0, 2)
    assert coded["bytes_read_per_token"] == pytest.approx(0.7 * stream + experts)
    assert coded["cpu_seconds"] == pytest.approx((stream / 2e9 + (stream + experts) / 10e9) / 2)
    rows = [{"trunk": "t", "options": [], "pinned_layers": 0, "vs_disk_floor": 0.8, "trunk_codec": "raw"}]
    assert [p["cores"] for p in projections(rows, [("t", 1.0)], None, 5e9)] == [2, 8, 16]
    assert projections(rows, [("t", 1.0)], None, 5e9)[0]["overhead"] == 1.0  # never below the disk floor
    assert projections(rows, [("t", 0.7)], None, 5e9) == []  # a coded trunk needs its decode rate
    spec = projections(rows, [("t", 1.0)], None, 5e9, {"agentic": [Drafts(1, 1.9, 2.0), Drafts(8, 6.8, 8.1)]})
    fast = spec[-1]["speculation"]["agentic"]  # 16 cores: disk-bound, where eight drafts pay most
    assert fast["k"] == 8 and fast["seconds_per_token"] < spec[-1]["seconds_per_token"]
    from k3core.cli.bench.stream import stream_table
    table = stream_table({"raw_o_direct_probe": {"rate": 1e9, "queue_depth": 16}, "runs": [], "draft_source": "suffix",
                          "projection_k3_8gb": spec})
    assert "| suffix, agentic: s/token (K) |" in table and f"| {fast['seconds_per_token']:.1f} (8) |" in table


# a kind's turns, new prompt ids, context ids and reply ids in drafts_doc: agentic (rewrite and tool_loop) has 10
# turns of 900 new prompt ids after 6,000, replying 110; plain, 2 of 500 after none, replying 300
CENSUS_FIELDS = ("turns", "prompt_ids", "context_ids", "reply_ids")
CENSUS = {"rewrite": (4, 6_000, 20_000, 800), "tool_loop": (6, 3_000, 40_000, 300), "plain": (2, 1_000, 0, 600)}


def drafts_doc(kinds=("rewrite", "tool_loop", "plain"), fields=CENSUS_FIELDS) -> dict:
    """A `k3 bench drafts --transcripts --json` document's shape: each kind's census of its turns (`fields` of
    it), ids, passes and drafted ids per kind and K."""
    def counts(k: int, kind: str) -> dict:
        passes = 100 if kind == "plain" else 100 // k + 10
        return {"ids": 150 if kind == "plain" else 100 + 10 * k, "passes": passes, "proposed": passes * min(k, 3)}

    by_k = {name: {"all": counts(k, kinds[0]), "by_kind": {kind: counts(k, kind) for kind in kinds}}
            for name, k in (("1", 1), ("2", 2), ("4", 4), ("8", 8), ("auto", 8))}
    census = {kind: dict(zip(CENSUS_FIELDS, CENSUS.get(kind, (1, 100, 0, 50)))) for kind in kinds}
    return {"kinds": {kind: {f: census[kind][f] for f in fields} for kind in kinds},
            "sources": {"suffix": {"counts": by_k}}}


def test_bench_project_prints_the_ram_table_marking_every_k3_figure_projected(capsys, tmp_path):
    drafts = tmp_path / "drafts.json"
    drafts.write_text(json.dumps(drafts_doc()))
    assert main(["bench", "project", "--drafts-json", str(drafts), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["ram"] for r in doc["rows"]] == [8e9, 32e9, 64e9, 128e9]
    assert [r["c_engine_seconds"] for r in doc["rows"]] == [26.5, 24.2, 19.8, 5.6]
    assert set(doc["drafts"]) == {"agentic", "plain"} and doc["draft_source"] == "suffix"
    agentic = doc["drafts"]["agentic"][0]  # K = 1 over rewrite and tool_loop together: 220 ids in 220 passes
    assert (agentic["k"], agentic["tokens_per_pass"], agentic["rows_per_pass"]) == (1, 1.0, 2.0)
    for r in doc["rows"]:
        assert r["lossless"]["seconds_per_token"] <= r["raw"]["seconds_per_token"] * 1.0001
        assert {r["speculation"][g]["k"] for g in ("agentic", "plain")} <= {1, 2, 4, 8}
    assert main(["bench", "project", "--drafts-json", str(drafts)]) == 0
    table = capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("| 8 GB | 26.5 |")]
    assert len(rows) == 1 and rows[0].count("*projected*") == 4
    assert "| k3 + suffix, agentic | k3 + suffix, plain |" in table and "**projected**" in table
    drafts.write_text(json.dumps(drafts_doc(("a", "b"))))  # kinds of another file: one group of all of them
    assert main(["bench", "project", "--drafts-json", str(drafts), "--json"]) == 0
    assert list(json.loads(capsys.readouterr().out)["drafts"]) == ["all kinds"]
    assert main(["bench", "project", "--drafts-json", str(drafts), "--draft-source", "ngram"]) == 2
    assert "has no source 'ngram'; it has suffix" in capsys.readouterr().err


def test_bench_project_draws_its_tables_into_the_same_svg_bytes_every_time(capsys, tmp_path, monkeypatch):
    drafts = tmp_path / "drafts.json"
    drafts.write_text(json.dumps(drafts_doc()))
    charts = [tmp_path / "a.svg", tmp_path / "b.svg"]
    for chart in charts:
        assert main(["bench", "project", "--drafts-json", str(drafts), "--chart", str(chart)]) == 0
    assert f"chart written to {charts[1]}" in capsys.readouterr().err
    svg = charts[0].read_text()
    assert charts[0].read_bytes() == charts[1].read_bytes() and "<dc:date>" not in svg
    for label in ("C engine, published", "k3 + suffix, agentic", "47k-id prompt, cached", "not a measurement"):
        assert label in svg, label
    assert main(["bench", "project", "--chart", str(tmp_path / "chart.txt")]) == 2
    assert "--chart " in (err := capsys.readouterr().err) and "ending in .svg or .png" in err
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed: said, with the extra that brings it
    assert main(["bench", "project", "--chart", str(tmp_path / "c.svg")]) == 2
    assert "pip install 'k3[charts]'" in capsys.readouterr().err and not (tmp_path / "c.svg").exists()


def test_bench_project_charges_an_agent_turn_its_new_prompt_ids_and_its_reply_ids(capsys, tmp_path):
    """Each group's mean turn (drafts_doc's CENSUS) costs the prefill of its new prompt ids after its context, in
    the prompt table's chunk, plus its reply ids at the group's speculative s/token: recomputed here."""
    from k3core.cli.bench.project import prefill_where
    from k3core.machine.cost import Machine
    from k3core.plan.prefill import K3, Rates, prompt_seconds

    drafts = tmp_path / "drafts.json"
    drafts.write_text(json.dumps(drafts_doc()))
    assert main(["bench", "project", "--drafts-json", str(drafts), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    mix = doc["turn_mix"]
    assert [mix["agentic"][f] for f in ("new_prompt_ids_per_turn", "context_ids_per_turn", "reply_ids_per_turn")
            ] == [900, 6_000, 110]
    assert [mix["plain"][f] for f in ("new_prompt_ids_per_turn", "context_ids_per_turn", "reply_ids_per_turn")
            ] == [500, 0, 300]
    machine = Machine(**doc["machine"])
    assert len(doc["agent"]) == len(doc["rows"]) == len(doc["prompt"]) == 4
    for agent, row, prompt in zip(doc["agent"], doc["rows"], doc["prompt"]):
        where = prefill_where(row["ram"])
        rates = Rates(machine.disk, machine.cores, doc["prefill_macs_per_core"], doc["attention_macs_per_core"])
        assert prompt["ttft"]["2000"]["cold"] == prompt_seconds(K3, where, rates, prompt["chunk"], 2000)  # its terms
        for group, m in mix.items():
            context, new, reply = m["context_ids_per_turn"], m["new_prompt_ids_per_turn"], m["reply_ids_per_turn"]
            prefill = prompt_seconds(K3, where, rates, prompt["chunk"], context + new, context)
            turn = prefill + reply * row["speculation"][group]["seconds_per_token"]
            c = agent["groups"][group]
            assert c["seconds_per_turn"] == pytest.approx(turn) and c["prefill_seconds"] == pytest.approx(prefill)
            assert c["seconds_per_reply_id"] == pytest.approx(turn / reply)
        cold = prompt_seconds(K3, where, rates, prompt["chunk"], 6_900)
        assert agent["groups"]["agentic"]["prefill_seconds"] < cold  # the context is not charged again
    assert main(["bench", "project", "--drafts-json", str(drafts)]) == 0
    table = capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("| 8 GB | agentic | 10 | 900 | 6,000 | 110 |")]
    assert len(rows) == 1 and rows[0].count("*projected*") == 5
    assert main(["bench", "project"]) == 0
    out = capsys.readouterr().out
    assert "no --drafts-json, so no agent turns" in out and "| 8 GB | agentic |" not in out


def test_bench_project_refuses_a_drafts_json_without_prompt_ids_saying_how_to_write_it_again(capsys, tmp_path):
    drafts = tmp_path / "old.json"
    drafts.write_text(json.dumps(drafts_doc(fields=("turns", "reply_ids"))))  # before prompt ids were counted
    assert main(["bench", "project", "--drafts-json", str(drafts)]) == 2
    err = capsys.readouterr().err
    assert f"--drafts-json {drafts}: kinds.rewrite has no prompt_ids or context_ids" in err
    assert "make bench-drafts-bpe" in err and "Traceback" not in err


def test_bench_pair_runs_two_packs_in_one_process_taking_turns(tiny_model, tmp_path, capsys):
    from k3core.io.pack import pack

    raw, coded = tmp_path / "raw", tmp_path / "coded"
    pack(tiny_model, raw)
    pack(tiny_model, coded, codec="planes", block_bytes=65536)
    assert main(["bench", "pair", str(tiny_model), "--trunk", str(raw), "--compare-trunk", str(coded),
                 "--trunk-gb", "0.002", "--cache-gb", "0", "--gen", "4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    first, second = doc["runs"]
    assert (first["trunk_codec"], second["trunk_codec"]) == ("raw", "planes") and doc["same_ids"]
    assert len(doc["ids"]) == 4 and len(first["token_seconds"]) == len(second["token_seconds"]) == 4
    assert doc["second_vs_first_median"] > 0 and first["ring_slots"] > 0
    from k3core.cli.bench.pair import pair_table
    assert "same ids: yes" in pair_table(doc) and "| planes |" in pair_table(doc)
    assert main(["bench", "pair", str(tiny_model), "--trunk", str(raw), "--compare-trunk", str(coded),
                 "--gen", "1"]) == 2
    assert "--gen must be 2..4096" in capsys.readouterr().err


def test_bench_pair_whose_packs_disagree_exits_4_naming_both(tiny_model, tmp_path, capsys, monkeypatch):
    import k3core.api
    from k3core.io.pack import pack

    raw, coded = tmp_path / "raw", tmp_path / "coded"
    pack(tiny_model, raw)
    pack(tiny_model, coded, codec="planes", block_bytes=65536)
    real, calls = k3core.api.generate_ids, []

    def second_one_off(engine, prompt, state):  # the second engine's ids come out one higher, as a bad pack's would
        shift = len(calls)
        calls.append(engine)
        return ((token + shift, logits) for token, logits in real(engine, prompt, state))

    monkeypatch.setattr(k3core.api, "generate_ids", second_one_off)
    assert main(["bench", "pair", str(tiny_model), "--trunk", str(raw), "--compare-trunk", str(coded),
                 "--gen", "2"]) == 4
    out, err = capsys.readouterr()
    assert "same ids: NO" in out and f"the packs disagree: {raw} generated" in err and str(coded) in err


def test_the_fma_probe_counts_the_multiply_adds_it_does():
    lanes = {"scalar": 1, "neon": 2, "avx2": 4, "avx512": 8}  # doubles per instruction
    for backend in _native.available_backends():
        assert _native.fma_probe(backend, 10) == 10 * 12 * lanes[backend], backend
    with pytest.raises(ValueError, match="nosuch"):
        _native.fma_probe("nosuch", 10)


def test_bench_agent_forwards_less_with_the_prompt_cache_and_the_same_ids(capsys):
    """A small agent workload on the demo model: the prompt cache forwards fewer prompt ids than a conversation's
    own state, which forwards fewer than none; a restart resumes from disk; every mode the same ids."""
    from ...conftest import DEMO_MODEL

    assert main(["bench", "agent", str(DEMO_MODEL), "--system-ids", "300", "--tool-ids", "40", "--turns", "2",
                 "--tokens", "3", "--interval", "128", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    modes = {m["mode"]: m for m in doc["modes"]}
    assert doc["same_ids"] and list(modes) == ["off", "conversation", "prefix", "disk"]
    assert modes["off"]["reused_ids"] == 0 and modes["off"]["forwarded_ids"] == modes["off"]["prompt_ids"]
    assert modes["prefix"]["forwarded_ids"] < modes["conversation"]["forwarded_ids"] < modes["off"]["forwarded_ids"]
    assert modes["disk"]["forwarded_ids"] == modes["prefix"]["forwarded_ids"]
    restart = modes["disk"]["after_restart"]
    assert restart["requests"] == 1 and restart["reused_ids"] > 300


def test_bench_project_takes_attentions_own_rate_and_refuses_a_rate_of_zero(capsys):
    """--attention-macs-per-core replaces the default (ATTENTION_RATIO of the prefill rate): at the prefill rate
    itself a cold 30k prompt projects faster; 0 is refused naming the flag."""
    from k3core.plan.prefill import ATTENTION_RATIO

    assert main(["bench", "project", "--json"]) == 0
    default = json.loads(capsys.readouterr().out)
    assert default["attention_macs_per_core"] == pytest.approx(ATTENTION_RATIO * default["prefill_macs_per_core"])
    assert main(["bench", "project", "--json", "--attention-macs-per-core", "27"]) == 0
    same_rate = json.loads(capsys.readouterr().out)
    assert same_rate["attention_macs_per_core"] == 27e9
    assert same_rate["prompt"][0]["ttft"]["30000"]["cold"] < default["prompt"][0]["ttft"]["30000"]["cold"]
    with pytest.raises(SystemExit) as refused:
        main(["bench", "project", "--attention-macs-per-core", "0"])
    assert refused.value.code == 2 and "--attention-macs-per-core" in capsys.readouterr().err
