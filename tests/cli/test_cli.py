"""The `k3` command: run output and JSON report, plugins listing, and bad input — each a clear
message on stderr, exit 2, no traceback and nothing written."""
import json
import shutil
import struct
import subprocess
import sys

import pytest

from k3core.cli.main import main

HEAD = "language_model.model."


@pytest.fixture
def model_copy(tiny_model, tmp_path):
    return shutil.copytree(tiny_model, tmp_path / "model")


def rewrite_header(shard, change):
    """Apply `change` to a shard's parsed header and write it back (data region untouched)."""
    raw = shard.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    change(header)
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    shard.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])


def run_k3(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_refused(capsys, argv, needle, written):
    code, out, err = run_k3(capsys, *argv)
    assert code == 2, (code, out, err)
    assert needle in err and "Traceback" not in err
    assert not written.exists()


def test_run_prints_ids_and_writes_the_json_report(capsys, tiny_model, tmp_path):
    report = tmp_path / "run.json"
    code, out, _ = run_k3(capsys, "run", tiny_model, "--ids", "1,2,3", "--gen", "4", "--json", report)
    assert code == 0
    data = json.loads(report.read_text())
    assert data["prompt_ids"] == [1, 2, 3] and len(data["generated_ids"]) == 4
    assert out.split()[:4] == [str(t) for t in data["generated_ids"]]
    assert data["seconds_per_token"] > 0 and data["peak_rss_bytes"] > 10 * 2**20
    steps = data["decode_steps"]  # ids 2..4, each with the bytes it read
    assert len(steps) == 3 and sum(s["seconds"] for s in steps) / 3 == pytest.approx(data["seconds_per_token"])
    in_ram = [s["seconds"] for s in steps if s["bytes_read"] == 0]
    assert data["steps_in_ram"] == len(in_ram)
    assert data["seconds_per_token_in_ram"] == (pytest.approx(sum(in_ram) / len(in_ram)) if in_ram else None)
    code, out2, _ = run_k3(capsys, "run", tiny_model, "--ids", "1 2 3", "--gen", "4", "--full-recompute")
    assert out2.split()[:4] == out.split()[:4]


def test_the_report_names_the_steps_that_read_nothing_only_beside_steps_that_did():
    from k3core.report.run import _in_ram_part
    steps = [{"seconds": 0.5, "bytes_read": 1}, {"seconds": 0.3, "bytes_read": 0}, {"seconds": 0.5, "bytes_read": 0}]
    report = {"decode_steps": steps, "steps_in_ram": 2, "seconds_per_token_in_ram": 0.4}
    assert _in_ram_part(report) == " (0.400 over the 2 of 3 steps that read nothing from disk)"
    assert _in_ram_part({**report, "steps_in_ram": 0, "seconds_per_token_in_ram": None}) == ""
    assert _in_ram_part({**report, "steps_in_ram": 3}) == ""  # every step: the mean says it already


def test_ids_file_is_a_prompt_source(capsys, tiny_model, tmp_path):
    (tmp_path / "p.txt").write_text("1, 2,\n3\n")
    code, out, _ = run_k3(capsys, "run", tiny_model, "--ids-file", tmp_path / "p.txt", "--gen", "2")
    assert code == 0 and len(out.splitlines()[0].split()) == 2


def test_no_prompt_is_refused(capsys, tiny_model, tmp_path):
    assert_refused(capsys, ["run", tiny_model, "--json", tmp_path / "r.json"], "no prompt", tmp_path / "r.json")


def test_two_prompt_sources_are_refused(capsys, tiny_model, tmp_path):
    (tmp_path / "p.txt").write_text("1")
    assert_refused(capsys, ["run", tiny_model, "--ids", "1", "--ids-file", tmp_path / "p.txt",
                            "--json", tmp_path / "r.json"], "two prompt sources", tmp_path / "r.json")


def test_token_id_outside_the_vocabulary_is_refused(capsys, tiny_model, tmp_path):
    assert_refused(capsys, ["run", tiny_model, "--ids", "1,256", "--json", tmp_path / "r.json"],
                   "id 256 at position 1", tmp_path / "r.json")


def test_a_non_integer_id_is_refused(capsys, tiny_model, tmp_path):
    assert_refused(capsys, ["run", tiny_model, "--ids", "1,x2", "--json", tmp_path / "r.json"],
                   "'x2' is not a token id", tmp_path / "r.json")


def test_a_truncated_shard_is_refused_naming_the_file(capsys, model_copy, tmp_path):
    shard = model_copy / "model-00003-of-000015.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1000])
    assert_refused(capsys, ["run", model_copy, "--ids", "1", "--json", tmp_path / "r.json"],
                   "model-00003-of-000015.safetensors", tmp_path / "r.json")


def test_a_header_length_past_eof_is_refused(capsys, model_copy, tmp_path):
    shard = model_copy / "model-00002-of-000015.safetensors"
    raw = shard.read_bytes()
    shard.write_bytes(struct.pack("<Q", len(raw) * 2) + raw[8:])
    assert_refused(capsys, ["run", model_copy, "--ids", "1", "--json", tmp_path / "r.json"],
                   "model-00002-of-000015.safetensors", tmp_path / "r.json")


def test_a_missing_tensor_is_refused_by_the_binding_check(capsys, model_copy, tmp_path):
    gone = HEAD + "layers.4.self_attn.dt_bias"
    rewrite_header(model_copy / "model-00005-of-000015.safetensors", lambda h: h.pop(gone))
    index = model_copy / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    del data["weight_map"][gone]
    index.write_text(json.dumps(data))
    assert_refused(capsys, ["run", model_copy, "--ids", "1", "--json", tmp_path / "r.json"],
                   f"missing tensor {gone}", tmp_path / "r.json")


def test_a_wrong_shape_is_refused_by_the_binding_check(capsys, model_copy, tmp_path):
    name = HEAD + "layers.2.input_layernorm.weight"

    def reshape(h):
        h[name]["shape"] = [2, 64]  # same bytes, wrong shape

    rewrite_header(model_copy / "model-00003-of-000015.safetensors", reshape)
    assert_refused(capsys, ["run", model_copy, "--ids", "1", "--json", tmp_path / "r.json"],
                   f"{name}: shape [2, 64], expected [128]", tmp_path / "r.json")


def test_a_config_with_three_missing_fields_lists_all_three(capsys, model_copy, tmp_path):
    cfg = json.loads((model_copy / "config.json").read_text())
    for key in ("hidden_size", "vocab_size", "activation_situ_beta"):
        del cfg["text_config"][key]
    (model_copy / "config.json").write_text(json.dumps(cfg))
    code, _, err = run_k3(capsys, "run", model_copy, "--ids", "1", "--json", tmp_path / "r.json")
    assert code == 2 and "3 problem(s)" in err
    for key in ("hidden_size", "vocab_size", "activation_situ_beta"):
        assert key in err
    assert not (tmp_path / "r.json").exists()


def test_an_unknown_plugin_name_is_refused(capsys, tiny_model, tmp_path):
    assert_refused(capsys, ["run", tiny_model, "--ids", "1", "--kernels", "nope", "--json", tmp_path / "r.json"],
                   "no kernel backend named 'nope'", tmp_path / "r.json")


def test_plugins_json_lists_every_builtin_with_its_hooks(capsys):
    code, out, _ = run_k3(capsys, "plugins", "--json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert code == 0
    assert rows["k3.kda"]["provides"] == {"k3_attention_backends": ["kda"]}
    assert rows["k3.reference_kernels"]["hooks"] == ["k3_kernel_backends"]
    assert all(r["source"] == "built-in" and r["version"] for n, r in rows.items() if n.startswith("k3."))
    assert rows["wizard"]["source"] == "entry point of k3" and "setup" in rows["wizard"]["provides"]["k3_subcommands"]


def test_k3_help_lists_every_route_serve_has():
    """`k3 --help`'s line for serve names each path its router serves, no more and no fewer (issue 42: it had left
    out /v1/responses), read from serve's real router, so a route added later fails here until the line names it."""
    import argparse
    import re

    from k3core.cli.main import build_parser
    from serve.api import ApiOptions
    from serve.app import api_router

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    line = next(a.help for a in commands._choices_actions if a.dest == "serve")
    assert set(re.findall(r"/[\w/{}]+", line)) == {route.path for route in api_router(None, ApiOptions()).routes}


def test_python_dash_m_runs_the_same_command_with_exit_codes(tiny_model):
    ok = subprocess.run([sys.executable, "-m", "k3core", "--version"], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.startswith("k3 ")
    bad = subprocess.run([sys.executable, "-m", "k3core", "run", str(tiny_model)], capture_output=True, text=True)
    assert bad.returncode == 2 and "no prompt" in bad.stderr


def test_dump_logits_lets_two_configurations_be_compared_byte_for_byte(capsys, tiny_model, tmp_path):
    from k3core import _native
    dumps = []
    for i, (backend, threads) in enumerate([("scalar", 1), (_native.available_backends()[0], 2)]):
        path = tmp_path / f"{i}.f32"
        code, _, _ = run_k3(capsys, "run", tiny_model, "--ids", "4,5,6", "--gen", "3", "--kernels", backend,
                            "--threads", threads, "--dump-logits", path)
        assert code == 0
        dumps.append(path.read_bytes())
    assert len(dumps[0]) == 3 * 256 * 4 and dumps[0] == dumps[1]


def test_zero_threads_is_refused(capsys, tiny_model, tmp_path):
    assert_refused(capsys, ["run", tiny_model, "--ids", "1", "--threads", "0", "--dump-logits", tmp_path / "l"],
                   "--threads must be an integer in 1..1024, got 0", tmp_path / "l")


def test_a_text_prompt_streams_text_and_the_same_seed_gives_the_same_text(capsys, small_model):
    outs = []
    for seed in (5, 5, 6):
        code, out, _ = run_k3(capsys, "run", small_model, "--prompt", "Hello, world", "--max-tokens", "12",
                              "--temperature", "1.0", "--seed", seed, "--quiet")
        assert code == 0
        outs.append(out)
    assert outs[0] == outs[1] != outs[2]


def test_greedy_is_temperature_zero_for_text_and_ids(capsys, small_model, tmp_path):
    from k3core.text.tokenizer import load_tokenizer
    ids = ",".join(map(str, load_tokenizer(small_model).encode("Hello, world")))
    run_k3(capsys, "run", small_model, "--prompt", "Hello, world", "--gen", "8", "--quiet", "--json", tmp_path / "a.json")
    _, by_ids, _ = run_k3(capsys, "run", small_model, "--ids", ids, "--gen", "8", "--temperature", "0", "--quiet")
    generated = json.loads((tmp_path / "a.json").read_text())["generated_ids"]
    assert by_ids.split() == [str(t) for t in generated]


def test_chat_thinking_mode_opens_think_and_keeps_thinking_off_stdout(capsys, small_model, tmp_path):
    from k3core.text.tokenizer import load_tokenizer
    tok = load_tokenizer(small_model)
    code, out, _ = run_k3(capsys, "run", small_model, "--prompt", "Hi", "--chat", "--thinking", "--gen", "6",
                          "--quiet", "--json", tmp_path / "r.json")
    report = json.loads((tmp_path / "r.json").read_text())
    prefix = [tok.id_of("<|open|>"), *tok.encode("think"), tok.id_of("<|sep|>")]
    assert code == 0 and report["prompt_ids"][-len(prefix):] == prefix
    generated = report["generated_ids"]
    if tok.id_of("<|close|>") not in generated:  # the reply never left the think channel
        assert out == "\n"


def test_a_prompt_and_ids_together_are_refused(capsys, small_model, tmp_path):
    assert_refused(capsys, ["run", small_model, "--prompt", "hi", "--ids", "1", "--json", tmp_path / "r.json"],
                   "two prompt sources", tmp_path / "r.json")


def test_thinking_without_chat_is_refused(capsys, small_model, tmp_path):
    assert_refused(capsys, ["run", small_model, "--prompt", "hi", "--thinking", "--json", tmp_path / "r.json"],
                   "add --chat", tmp_path / "r.json")


def test_speculate_gives_the_serial_ids_and_logits_and_reports_the_drafts(capsys, tiny_model, tmp_path):
    base = ["run", tiny_model, "--ids", "3,1,4,1,5,9,2,6", "--gen", "12"]
    assert run_k3(capsys, *base, "--json", tmp_path / "serial.json", "--dump-logits", tmp_path / "a.f32")[0] == 0
    serial = json.loads((tmp_path / "serial.json").read_text())
    (tmp_path / "oracle.txt").write_text(" ".join(map(str, serial["generated_ids"])))
    for flags, source in ((["--speculate", "4", "--draft", f"replay:{tmp_path / 'oracle.txt'}"], "replay"),
                          (["--speculate", "auto"], "ngram")):
        code, _, err = run_k3(capsys, *base, *flags, "--json", tmp_path / "spec.json", "--dump-logits", tmp_path / "b.f32")
        assert code == 0, err
        spec = json.loads((tmp_path / "spec.json").read_text())
        assert spec["generated_ids"] == serial["generated_ids"]
        assert (tmp_path / "b.f32").read_bytes() == (tmp_path / "a.f32").read_bytes()
        assert f"drafts from {source}: " in err and "accepted" in err and "forward passes" in err
    assert spec["speculate"] == "auto" and spec["draft"] == "ngram"
    code, _, _ = run_k3(capsys, *base, "--speculate", "4", "--draft", f"replay:{tmp_path / 'oracle.txt'}",
                        "--json", tmp_path / "oracle.json")
    oracle = json.loads((tmp_path / "oracle.json").read_text())
    assert serial["forward_passes"] == 12 and oracle["forward_passes"] == 1 + 3  # 11 ids after the first, 5 a pass
    # 4 + 4 drafts, then the one id left in the replay, each accepted
    assert (oracle["draft_proposed"], oracle["draft_accepted"]) == (9, 9)
    for key in ("forward_passes", "draft_proposed", "draft_accepted", "bytes_read_per_token"):
        assert key in serial


@pytest.mark.parametrize("flags, needle", [
    (["--speculate", "0"], "--speculate takes a number of drafted ids 1..16 or auto, got '0'"),
    (["--speculate", "lots"], "--speculate takes a number"),
    (["--speculate", "17"], "got '17'"),
    (["--draft", "ngram"], "--draft needs --speculate K or --speculate auto"),
    (["--speculate", "2", "--draft", "nope"], "draft source"),
    (["--speculate", "2", "--draft", "replay:/no/such/file"], "cannot read it"),
    (["--speculate", "2", "--draft", "ngram:3"], "--draft ngram takes no argument"),
    (["--speculate", "2", "--full-recompute"], "do not combine"),
])
def test_bad_speculation_flags_are_refused(capsys, tiny_model, tmp_path, flags, needle):
    assert_refused(capsys, ["run", tiny_model, "--ids", "1,2", "--json", tmp_path / "r.json", *flags], needle,
                   tmp_path / "r.json")


def command_plugin(plugin_name, *commands):
    """An in-process plugin (a module named `plugin_name`) adding `commands`, each printing who ran it."""
    import types

    from k3core.hookspecs import hookimpl

    @hookimpl
    def k3_subcommands(subparsers):
        for command in commands:
            p = subparsers.add_parser(command, help=f"{plugin_name}'s {command}")
            p.add_argument("--flag")
            p.set_defaults(func=lambda args, c=command: print(f"{plugin_name} ran {c} {args.flag}") or 0)

    plugin = types.ModuleType(plugin_name)
    plugin.k3_subcommands = k3_subcommands
    return plugin


def test_two_plugins_adding_one_subcommand_name_it_and_leave_the_rest_working(capsys, monkeypatch):
    from k3core import plugin_manager as plugins

    pm = plugins.new_plugin_manager([command_plugin("alpha", "greet", "wave"), command_plugin("beta", "greet", "bow")])
    monkeypatch.setattr(plugins, "get_plugin_manager", lambda: pm)
    for argv in (["greet", "--flag", "x"], ["greet", "--help"], ["greet"]):
        code, out, err = run_k3(capsys, *argv)
        assert (code, out) == (2, "")
        assert err == ("k3: error: the plugins 'beta' and 'alpha' both add the subcommand 'greet', so `k3 greet` runs "
                       "neither: uninstall one of them, or load only one with K3_PLUGINS (`k3 plugins` lists each "
                       "plugin's commands)\n")
    assert run_k3(capsys, "wave", "--flag", "1")[:2] == (0, "alpha ran wave 1\n")
    assert run_k3(capsys, "bow", "--flag", "2")[:2] == (0, "beta ran bow 2\n")   # beta's other command is there
    assert run_k3(capsys, "presets", "--json")[0] == 0
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "wave" in out and "bow" in out and "setup" in out
    assert "unavailable: the plugins 'beta' and 'alpha' both add it (`k3 greet` says what to do)" in " ".join(out.split())


def test_a_plugin_taking_a_name_of_k3s_own_is_named(capsys, monkeypatch):
    from k3core import plugin_manager as plugins

    pm = plugins.new_plugin_manager([command_plugin("gamma", "presets")])
    monkeypatch.setattr(plugins, "get_plugin_manager", lambda: pm)
    code, out, err = run_k3(capsys, "presets")
    assert (code, out) == (2, "")
    assert err == ("k3: error: the plugin 'gamma' adds the subcommand 'presets', which is k3's own, so `k3 presets` "
                   "runs neither: uninstall the plugin, or leave it out with K3_PLUGINS (`k3 plugins` lists each "
                   "plugin's commands)\n")
    assert run_k3(capsys, "plugins")[0] == 0


def test_a_second_run_resumes_from_the_prompt_cache_and_says_so(capsys, tmp_path):
    """`k3 run --chat` twice with one system prompt: the second run's report says how many prompt ids the prompt
    cache on disk gave, and its reply is the first one's."""
    from ..conftest import DEMO_MODEL

    ask = ["run", str(DEMO_MODEL), "--chat", "What is the capital of France?", "--system", "Be brief.",
           "--max-tokens", "12", "--prompt-cache", str(tmp_path)]
    replies, reports = [], []
    for _ in range(2):
        assert main([*ask, "--json", str(tmp_path / "r.json")]) == 0
        out, err = capsys.readouterr()
        replies.append(out)
        reports.append(json.loads((tmp_path / "r.json").read_text()))
    assert replies[0] == replies[1] == "The capital of France is Paris.\n"
    n = len(reports[1]["prompt_ids"])
    assert reports[0]["reused_prompt_ids"] == 0 and reports[1]["reused_prompt_ids"] == n - 1
    assert f"prompt {n} ids ({n - 1} from the prompt cache)" in err and "prompt cache: " in err
    assert reports[1]["prompt_cache"]["prompt_cache_hits"] == 1


@pytest.mark.parametrize("flags, says", [
    (["--prompt-cache-disk-gb", "-1"], "argument --prompt-cache-disk-gb: takes GB >= 0, a finite number; got '-1'"),
    (["--prompt-cache-gb", "nan"], "argument --prompt-cache-gb: takes GB >= 0, a finite number; got 'nan'"),
    (["--prompt-cache-gb", "2000"], "--prompt-cache-gb must be a number of GB in 0..1024, got 2000.0"),
    (["--prompt-cache-interval", "0"], "--prompt-cache-interval takes a number of ids >= 1, got 0"),
    (["--prompt-cache", "/dev/null/cache"], "--prompt-cache /dev/null/cache: cannot use it"),
    (["--max-context", "lots"], "--max-context must be an integer in 16..1048576, or \"auto\", got 'lots'"),
])
def test_a_bad_prompt_cache_or_context_flag_is_exit_2_naming_it(capsys, flags, says):
    from ..conftest import DEMO_MODEL

    try:
        code = main(["run", str(DEMO_MODEL), "--chat", "Hi", "--max-tokens", "2", *flags])
    except SystemExit as refused:  # a flag's type refuses it while argparse parses (k3core/cli/options.py number)
        code = refused.code
    assert code == 2 and says in capsys.readouterr().err
