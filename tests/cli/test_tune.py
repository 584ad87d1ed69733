"""`k3 tune`: the search on its own (a fake measure, a fake clock), which knobs a model and budget can use, the
saved tuning and where it applies, and real tunes of the tiny model — one whose kernels change an id at one thread
count is refused naming the setting (exit 4), and a tune's winner is what a later run of the profile's model uses."""
from __future__ import annotations

import json
import os
import textwrap

import pytest

from k3core.cli.main import main
from k3core.errors import UnsoundRunError, UsageError
from k3core.interfaces import default_threads
from k3core.plan.profile import Profile, load_profile, save_profile
from k3core.plan.engine_config import EngineConfig
from k3core.plan.tuned import Tuned, fingerprint, machine_changes, tuning_for
from k3core.tune import knobs as K
from k3core.tune.run import Workload, tune
from k3core.tune.search import Search, Trial


@pytest.fixture(autouse=True)
def config_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("K3_CONFIG_DIR", str(tmp_path / "config"))
    return tmp_path / "config"


# ---- the search, with a fake measure ---------------------------------------------------------------------------

COSTS = {"a": {1: 10.0, 2: 8.0, 3: 9.0}, "b": {"x": 0.0, "y": -1.0}}


def figures(seconds: float) -> dict:
    return {"seconds_per_token": seconds / 10, "prefill_seconds": 1.0}


def fake(costs=COSTS, ids=(("same",),), odd=None):
    """A measure: seconds = the sum of each knob's cost; `odd` (knob, value) gives other ids."""
    calls = []

    def measure(setting, phase):
        calls.append((dict(setting), phase))
        seconds = sum(costs[k][v] for k, v in setting.items())
        wrong = odd is not None and setting.get(odd[0]) == odd[1]
        return Trial(setting, seconds, (("other",),) if wrong else ids, figures(seconds), took=1.0)

    return measure, calls


KNOBS = [K.Knob("a", (1, 2, 3), "a"), K.Knob("b", ("x", "y"), "b")]


def test_descent_takes_each_knobs_fastest_value_and_confirms_it():
    measure, calls = fake()
    out = Search(measure, deadline=1e9, clock=lambda: 0.0).descend(KNOBS, {"a": 1, "b": "x"})
    assert out.best == {"a": 2, "b": "y"} and out.complete
    assert calls == [({"a": 1, "b": "x"}, "prefill"),  # the first forwards the prompts (and keeps their states)
                     ({"a": 1, "b": "x"}, "decode"), ({"a": 2, "b": "x"}, "decode"), ({"a": 3, "b": "x"}, "decode"),
                     ({"a": 2, "b": "y"}, "decode"),
                     ({"a": 1, "b": "x"}, "decode"), ({"a": 2, "b": "y"}, "decode")]  # the confirming pair
    assert out.gain("decode") == pytest.approx(10.0 / 7.0) and out.gain("prefill") is None  # never forwarded


def test_a_value_within_the_noise_is_not_taken():
    measure, _ = fake({"a": {1: 10.0, 2: 9.8, 3: 10.5}, "b": {"x": 0.0, "y": 0.0}})
    out = Search(measure, deadline=1e9, clock=lambda: 0.0).descend(KNOBS, {"a": 1, "b": "x"})
    assert out.best == {"a": 1, "b": "x"} and not out.confirm  # 2 % faster is noise: nothing to confirm
    assert out.gain("decode") == 1.0


def test_a_win_that_does_not_hold_up_when_measured_again_is_dropped():
    seen = {}

    def measure(setting, phase):
        key = tuple(sorted(setting.items()))
        seen[key] = seen.get(key, 0) + 1
        first_time_lucky = setting == {"a": 2, "b": "x"} and seen[key] == 1
        seconds = 5.0 if first_time_lucky else 10.0
        return Trial(setting, seconds, ("same",), figures(seconds), took=1.0)

    out = Search(measure, deadline=1e9, clock=lambda: 0.0).descend(KNOBS, {"a": 1, "b": "x"})
    assert out.best == {"a": 1, "b": "x"} and len(out.confirm) == 2


def test_a_knob_of_the_prompts_pass_is_judged_by_the_prompts_time():
    phases = []

    def measure(setting, phase):  # chunk 128: a faster prompt, a reply no faster (and a little slower in total)
        phases.append(phase)
        prompt = 0.5 if setting["chunk"] == 128 else 1.0
        return Trial(setting, 11.0 if setting["chunk"] == 128 else 10.0, ("same",),
                     {"seconds_per_token": 1.0, "prefill_seconds": prompt}, took=1.0)

    knobs = [K.Knob("chunk", (64, 128), "prompt ids per pass", phase="prefill")]
    out = Search(measure, deadline=1e9, clock=lambda: 0.0).descend(knobs, {"chunk": 64})
    assert out.best == {"chunk": 128} and out.gain("prefill") == 2.0 and set(phases) == {"prefill"}


def test_a_knob_that_trades_reply_for_prompt_is_judged_by_a_conversation_with_its_own_ids():
    phases = []

    def measure(setting, phase):  # a prompt cache: the conversation faster, each reply a little slower
        phases.append(phase)
        cache = setting["cache"]
        ids = (("p1",), ("turn 2",)) if phase == "turn" else (("p1",), ("p2",))  # the second turn: p1, its reply, p2
        if phase == "turn" and cache == 2:
            ids = (("p1",), ("other",))
        if phase == "turn" and cache == 3:
            ids = (("not p1",), ("turn 2",))
        return Trial(setting, 1.0, ids, {"seconds_per_token": 1.0 + 0.1 * cache, "prefill_seconds": 1.0,
                                         "turn_seconds": 10.0 - 4 * min(cache, 1)}, took=1.0)

    knobs = [K.Knob("cache", (0, 1), "prompt cache", phase="turn")]
    out = Search(measure, deadline=1e9, clock=lambda: 0.0).descend(knobs, {"cache": 0})
    assert out.best == {"cache": 1} and out.gain("turn") == 10.0 / 6.0 and out.gain("decode") is None
    assert phases == ["prefill", "turn", "turn", "turn", "turn"]  # first, the untuned turns, cache=1, the pair
    broken = [K.Knob("cache", (0, 2), "prompt cache", phase="turn")]
    with pytest.raises(UnsoundRunError, match=r"cache=2 gave other ids than the untuned settings \(prompt 2, reply "
                                              r"id 1"):
        Search(measure, deadline=1e9, clock=lambda: 0.0).descend(broken, {"cache": 0})
    with pytest.raises(UnsoundRunError, match=r"cache=3 gave other ids than the untuned settings \(the first turn of a "
                                              r"conversation is the first prompt\) \(prompt 1, reply id 1"):
        Search(measure, deadline=1e9, clock=lambda: 0.0).descend([K.Knob("cache", (0, 3), "", phase="turn")],
                                                                 {"cache": 0})


def test_the_deadline_stops_new_trials_and_says_which_were_not_tried():
    run, calls = fake()
    now = [0.0]

    def measure(setting, phase):  # each trial takes a second of the fake clock
        now[0] += 1.0
        return run(setting, phase)

    out = Search(measure, deadline=3.5, clock=lambda: now[0]).descend(KNOBS, {"a": 1, "b": "x"}, confirm=False)
    assert not out.complete and len(calls) == 3  # the prompts forwarded, the untuned reply, a=2
    assert out.not_tried == ["a=3: --minutes reached", "b=y: --minutes reached"]


def test_a_setting_that_changes_ids_stops_the_search_naming_it():
    measure, _ = fake(odd=("b", "y"))
    with pytest.raises(UnsoundRunError, match=r"b=y gave other ids than the untuned settings"):
        Search(measure, deadline=1e9, clock=lambda: 0.0).descend(KNOBS, {"a": 1, "b": "x"})


def test_the_grid_measures_every_combination_a_knob_applies_to():
    measure, calls = fake()
    knobs = [K.Knob("a", (1, 2, 3), "a"), K.Knob("b", ("x", "y"), "b", lambda s: s["a"] != 3)]
    out = Search(measure, deadline=1e9, clock=lambda: 0.0).grid(knobs, {"a": 1, "b": "x"})
    assert [phase for _, phase in calls] == ["prefill"] + ["decode"] * 5
    assert ({"a": 3, "b": "y"}, "decode") not in calls  # b means nothing at a=3
    assert out.best == {"a": 2, "b": "y"}


# ---- which knobs can matter ---------------------------------------------------------------------------------

def shape(**changes):
    base = dict(cores=4, layers=8, trunk_streams=True, experts_stream=True,
                store_options=frozenset(K.STORE_KNOBS), budget_gb=4.0, splits=(2.0, 3.0), longest_prompt=40,
                has_family_threads=True, trunk_gb=2.0, cache_gb=2.0, top_k=8,
                expert_kib=2048)
    return K.Shape(**{**base, **changes})


def knob_names(s: K.Shape, base=None) -> tuple[list[str], list[str]]:
    base = base or EngineConfig("m", trunk="t", trunk_gb=2.0, cache_gb=2.0)
    knobs, left = K.knobs_for(s, K.start_setting(base, s))
    return [k.name for k in knobs], left


def test_a_streamed_model_turns_the_ring_the_split_and_the_expert_reads():
    names, left = knob_names(shape())
    assert names[:3] == ["draft", "speculate", "threads"]
    assert {"trunk_gb", "ring", "read_threads", "read_kib", "prefetch", "prefetch_depth", "read_ahead",
            "kernel_threads.attention"} <= set(names)
    assert "self" not in next(k for k in K.knobs_for(shape(), {"trunk_gb": 2.0})[0] if k.name == "draft").values
    assert any(line.startswith("prefill_chunk: the longest prompt (40 ids)") for line in left)


def test_a_resident_model_leaves_out_what_cannot_move_and_says_why():
    names, left = knob_names(shape(trunk_streams=False, experts_stream=False, budget_gb=None, splits=()),
                             EngineConfig("m"))
    assert not {"ring", "trunk_gb", "read_threads", "prefetch"} & set(names)
    assert any("every expert is cached" in line for line in left) and any(line.startswith("ring:") for line in left)


def test_a_draft_trunk_adds_the_self_and_auto_sources_and_long_prompts_the_chunk():
    s = shape(draft_gb={"int8": 0.5}, longest_prompt=300)
    knobs, _ = K.knobs_for(s, K.start_setting(EngineConfig("m", trunk="t"), s))
    by = {k.name: k for k in knobs}
    assert by["draft"].values == ("off", "suffix", "ngram", "self", "auto")
    assert 256 in by["prefill_chunk"].values and 1024 not in by["prefill_chunk"].values


def test_a_setting_becomes_the_engine_config_and_speculation_it_names():
    base = EngineConfig("m", trunk="t", preset="laptop", store_options={"direct_io": False})
    setting = {"draft": "suffix", "speculate": 4, "threads": 2, "kernel_threads.attention": 1,
               "kernel_threads.dense": 0, "ring": 3, "trunk_gb": 2.5, "prefetch": False}
    config, spec = K.engine_config(base, setting, shape())
    assert spec == {"draft": "suffix", "k": 4}
    assert (config.threads, dict(config.kernel_threads), config.ring, config.trunk_gb, config.cache_gb) == \
        (2, {"attention": 1}, 3, 2.5, 1.5)
    assert dict(config.store_options) == {"direct_io": False, "prefetch": False} and config.preset is None
    coded, _ = K.engine_config(base, {**setting, "pin_coded": True}, shape())
    assert dict(coded.placer_options) == {"pin_coded": True}
    start = {**setting, "threads": 4, "kernel_threads.attention": 0, "ring": 2, "trunk_gb": 2.0, "prefetch": True}
    assert K.saved_engine(base, setting, start, shape()) == {
        "threads": 2, "kernel_threads": {"attention": 1}, "ring": 3, "trunk_gb": 2.5, "cache_gb": 1.5,
        "store_options": {"prefetch": False}}
    assert K.saved_engine(base, setting, setting, shape()) == {}  # what the tune kept untuned stays k3's default


def test_the_prompt_cache_and_the_draft_trunk_take_their_ram_from_the_expert_cache():
    s = shape(draft_gb={"int8": 0.5, "int4": 0.3}, conversation=True)
    base = EngineConfig("m", trunk="t", trunk_gb=2.0, cache_gb=2.0, draft_trunk="int8")
    start = K.start_setting(base, s)
    knobs = {k.name: k for k in K.knobs_for(s, start)[0]}
    assert knobs["draft_trunk"].values == ("int8", "int4") and knobs["prompt_cache_gb"].phase == "turn"
    assert knobs["prompt_cache_gb"].values == (0.0, 0.25, 0.5, 1.0)
    assert knobs["draft_topk"].values == (None, 1, 2, 8)  # None: half of 8, so 4 is not tried again
    assert not knobs["draft_trunk"].applies({**start, "draft": "suffix"})

    def held(setting):  # what the setting's engine holds of the budget
        config, _ = K.engine_config(base, setting, s)
        return config, round(config.trunk_gb + config.cache_gb + config.prompt_cache_gb
                             + (s.draft_gb[config.draft_trunk] if config.draft_trunk else 0), 3)

    config, total = held(start)
    assert (config.draft_trunk, config.cache_gb, total) == (None, 2.0, 4.0)  # drafting with no model: no draft trunk
    config, total = held({**start, "draft": "self", "draft_trunk": "int4", "draft_topk": 2, "prompt_cache_gb": 0.5})
    assert (config.draft_trunk, config.draft_topk, config.cache_gb, config.prompt_cache_gb, total) == \
        ("int4", 2, 1.2, 0.5, 4.0)
    assert s.cache_gb_for({**start, "trunk_gb": 3.0, "prompt_cache_gb": 1.0, "draft": "auto"}) == -0.5
    saved = K.saved_engine(base, {**start, "prompt_cache_gb": 0.5}, start, s)
    assert saved == {"prompt_cache_gb": 0.5, "cache_gb": 1.5, "trunk_gb": 2.0}


def test_expert_reads_smaller_than_a_piece_and_deeper_prefetch_are_tried_where_they_can_move():
    names, left = knob_names(shape(expert_kib=200))
    assert "read_kib" not in names and "read_kib: an expert is 200 KiB, read whole already" in left
    knobs = {k.name: k for k in K.knobs_for(shape(), K.start_setting(EngineConfig("m"), shape()))[0]}
    assert knobs["read_kib"].values == (0, 256, 1024) and knobs["prefetch_depth"].values == (1, 2, 4)
    assert not knobs["prefetch_depth"].applies({"prefetch": False})
    names, left = knob_names(shape(conversation=False))
    assert "prompt_cache_gb" not in names and any(x.startswith("prompt_cache_gb: one prompt") for x in left)


def test_a_conversation_sends_each_turn_whole_with_the_replies_before_it():
    from k3core.tune.trial import conversation

    replies = []
    turns = conversation({"prompts": [[1, 2], [3], [4, 5]]}, replies)
    assert next(turns) == [1, 2]
    replies.append([7, 8])
    assert next(turns) == [1, 2, 7, 8, 3]
    replies.append([9])
    assert next(turns) == [1, 2, 7, 8, 3, 9, 4, 5]


# ---- the saved tuning -----------------------------------------------------------------------------------------

def tuned(model, **changes) -> Tuned:
    base = dict(engine={"threads": 1, "ring": 3, "store_options": {"prefetch": False}, "trunk_gb": 2.0,
                        "cache_gb": 1.0},
                speculation={"draft": "suffix", "k": "auto"}, measured={"gain": 1.2}, when="2026-12-06T00:00:00+00:00",
                machine=fingerprint(model), model=str(model), trials=[])
    return Tuned(**{**base, **changes})


def test_flags_given_win_over_the_tuning_field_by_field(tmp_path):
    t = tuned(tmp_path)
    filled = t.fill({"threads": 2, "ring": None, "store_options": {"direct_io": False}, "trunk_gb": None,
                     "cache_gb": None, "preset": None})
    assert (filled["threads"], filled["ring"], filled["trunk_gb"], filled["cache_gb"]) == (2, 3, 2.0, 1.0)
    assert filled["store_options"] == {"prefetch": False, "direct_io": False}
    assert t.fill({"preset": "laptop"})["preset"] == "laptop" and "trunk_gb" not in t.fill({"preset": "laptop"})


def test_tuning_from_another_machine_is_not_used_and_says_what_changed(tmp_path):
    other = tuned(tmp_path, machine={**fingerprint(tmp_path), "cpus": 999})
    profile = Profile(str(tmp_path), tuned=other.as_dict())
    used, line = tuning_for(profile)
    assert used is None and "another machine (CPUs 999 → " in line and "`k3 tune`" in line
    assert machine_changes(fingerprint(tmp_path), fingerprint(tmp_path)) == []
    used, line = tuning_for(Profile(str(tmp_path), tuned=tuned(tmp_path).as_dict()))
    assert used is not None and "threads 1" in line
    assert tuning_for(Profile(str(tmp_path), tuned=tuned(tmp_path).as_dict()), tmp_path / "elsewhere") == (None, None)


def test_doctor_shows_the_tuning_or_says_to_tune_again(tmp_path):
    from k3core.machine.checks import check_tuning

    assert check_tuning().finding.startswith("not tuned: nothing is (no saved profile yet)")
    save_profile(Profile(str(tmp_path), tuned=tuned(tmp_path, measured={
        "seconds_per_token": {"untuned": 2.0, "tuned": 1.6}, "gain": 1.25, "workload": {"prompts": 3, "reply_ids": 16}}
    ).as_dict()))
    ok = check_tuning()
    assert ok.status == "ok" and "tuned 2026-12-06 00:00 UTC: threads 1, ring 3" in ok.finding
    assert "1.25× the untuned speed per token; measured 2.000 s/token untuned, 1.600 tuned on 3 prompts × 16 ids" \
        in ok.finding
    moved = tuned(tmp_path, machine={**fingerprint(tmp_path), "ram_gb": 1})
    save_profile(Profile(str(tmp_path), tuned=moved.as_dict()))
    moved = check_tuning()
    assert moved.status == "warn" and "RAM GB 1 → " in moved.finding and "k3 tune" in moved.fix


def test_a_run_takes_the_tuned_fields_no_flag_gave(tiny_model, small_model):
    from k3core.cli.main import build_parser
    from k3core.cli.options import engine_config_from_args

    saved = tuned(tiny_model, engine={"threads": 1, "prefill_chunk": 64, "store_options": {"prefetch": False},
                                      "prompt_cache_gb": 0.25})
    save_profile(Profile(str(tiny_model), tuned=saved.as_dict()))

    def config(*argv):
        args = build_parser().parse_args(["run", "--ids", "1", *argv])
        return engine_config_from_args(args), args

    c, args = config()
    assert (c.threads, c.prefill_chunk, dict(c.store_options), c.prompt_cache_gb) == (1, 64, {"prefetch": False}, 0.25)
    assert (args.speculate, args.draft, c.speculate) == ("auto", "suffix", 8)
    assert config("--prompt-cache-gb", "2")[0].prompt_cache_gb == 2.0
    c, args = config("--threads", "2", "--speculate", "2", "--store-option", "prefetch=true")
    assert (c.threads, c.prefill_chunk, dict(c.store_options), c.speculate) == (2, 64, {"prefetch": True}, 2)
    assert args.draft is None
    assert config(str(tiny_model))[0].threads == 1          # the profile's model, named: tuned too
    c, _ = config(str(small_model))                          # another model: k3's defaults
    assert (c.threads, c.prefill_chunk, c.speculate, c.prompt_cache_gb) == (None, "auto", 0, 1.0)


def test_a_damaged_tuning_is_refused_naming_the_field(tmp_path):
    data = tuned(tmp_path).as_dict()
    with pytest.raises(UsageError, match=r"tuned: bad engine\.colour"):
        Tuned.from_dict({**data, "engine": {"colour": 1}}, "profile.json")
    with pytest.raises(UsageError, match=r"tuned: bad speculation"):
        Tuned.from_dict({**data, "speculation": {"draft": 3}}, "profile.json")


# ---- real tunes of the tiny model -------------------------------------------------------------------------------

BROKEN = '''
    """Kernels that give other bits at one thread: a knob that changes ids, which a tune must refuse."""
    from k3core.plugin_api import hookimpl
    from k3core.plugins.native_kernels import NativeKernels


    class OffByOneThread(NativeKernels):
        def __init__(self):
            super().__init__("scalar")
            self.k  # the native scalar kernels, made under their own name
            self.name = "off-by-one-thread"

        def available(self):
            return True

        def linear(self, w, x):
            y = super().linear(w, x)
            return y + 1e-3 if self.k.threads == 1 else y


    @hookimpl
    def k3_kernel_backends():
        return [OffByOneThread()]
'''


needs_two_cpus = pytest.mark.skipif(default_threads() < 2, reason="the threads knob needs two CPUs to turn")


@needs_two_cpus
def test_a_knob_that_changes_ids_is_refused_naming_it(tiny_model, tmp_path, monkeypatch):
    (tmp_path / "off_by_one_thread.py").write_text(textwrap.dedent(BROKEN))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(tmp_path))
    base = EngineConfig(tiny_model, kernels="off-by-one-thread", threads=2)
    work = Workload(((1, 2, 3, 4),), 4)
    with pytest.raises(UnsoundRunError, match=r"threads=1 gave other ids than the untuned settings"):
        tune(base, work, minutes=5, only=("threads",), plugins=("off_by_one_thread",), min_trial_seconds=0)


@needs_two_cpus
def test_a_tune_is_saved_and_used_by_a_run_of_the_profiles_model(tiny_model, capsys):
    save_profile(Profile(str(tiny_model)))
    assert main(["tune", "--knobs", "threads", "--reply", "4", "--minutes", "0.02", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    saved = load_profile().tuned
    assert doc["saved"] and saved["engine"] == {} and saved["machine"] == fingerprint(tiny_model)
    assert [(t["changed"], t["prompts"]) for t in saved["trials"]][:1] == [("(untuned)", "forwarded")]
    assert "threads=1: --minutes reached" in doc["not_tried"] and saved["measured"]["complete"] is False
    assert any("ring" in line for line in doc["not_turned"])
    assert main(["run", "--ids", "1,2", "--gen", "2"]) == 0
    err = capsys.readouterr().err
    assert f"tuned settings from {saved['when'][:10]}" in err and Tuned.from_dict(saved, "").summary() in err
    assert main(["run", "--ids", "1,2", "--gen", "2", "--quiet"]) == 0
    assert "tuned" not in capsys.readouterr().err


def test_the_prompt_cache_is_tuned_on_a_conversation_whose_ids_agree_with_and_without_it(tiny_model):
    work = Workload(((1, 2, 3, 4, 5, 6), (7, 8, 9)), 4)
    out = tune(EngineConfig(tiny_model), work, minutes=5, only=("prompt_cache_gb",), min_trial_seconds=0)
    turns = [t for t in out.trials if t.phase == "turn"]
    assert [t.setting["prompt_cache_gb"] for t in turns] == [0.0, 0.125, 0.25, 0.5]  # out of the 1 GB cache
    assert turns[0].ids[0] == out.trials[0].ids[0]  # the first turn is the first prompt, whatever follows it
    assert turns[0].ids[1] != out.trials[0].ids[1]  # the second turn is sent with the first and its reply


def test_ctrl_c_keeps_what_was_measured(tiny_model, capsys, monkeypatch):
    from k3core.tune import trial

    runs = []

    def measure(job, setting, env=None):  # the first trial lands, Ctrl-C comes during the second
        if runs:
            raise KeyboardInterrupt
        runs.append(setting)
        return Trial(dict(setting), 2.0, ((1, 2),), {"seconds_per_token": 0.1, "prefill_seconds": 0.5}, took=0.1)

    monkeypatch.setattr(trial, "measure", measure)
    save_profile(Profile(str(tiny_model)))
    assert main(["tune", "--reply", "4"]) == 130
    captured = capsys.readouterr()
    saved = load_profile().tuned
    assert saved["measured"]["complete"] is False and saved["engine"] == {} and saved["speculation"] is None
    assert "(incomplete: --minutes or Ctrl-C cut it short)" in captured.out and "saved in " in captured.out


def test_expert_reads_in_flight_and_prefetch_depth_are_bounded_naming_the_option(small_model):
    from k3core.api import open_engine

    for bad, says in ((0, r"read_threads: expert reads in flight must be an integer in 1\.\.256, got 0"),
                      (257, r"in 1\.\.256, got 257"), (True, r"store 'lru': read_threads must be int, got True")):
        with pytest.raises(UsageError, match=says):
            open_engine(EngineConfig(small_model, store_options={"read_threads": bad})).close()
    for bad, says in ((0, r"prefetch_depth: .* an integer in 1\.\.8, got 0"), (9, r"in 1\.\.8, got 9"),
                      (True, r"store 'lru': prefetch_depth must be int, got True")):
        with pytest.raises(UsageError, match=says):
            open_engine(EngineConfig(small_model, cache_gb=0.0, store_options={"prefetch_depth": bad})).close()


def test_tune_refuses_bad_usage_naming_the_flag(tiny_model, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["tune", str(tiny_model), "--minutes", "0"])
    assert exit_.value.code == 2 and "--minutes: takes minutes > 0" in capsys.readouterr().err
    assert main(["tune", str(tiny_model), "--reply", "0"]) == 2
    assert "--reply" in capsys.readouterr().err
    assert main(["tune", str(tiny_model), *["--prompt", "hi"] * 17]) == 2
    assert "--prompt: at most 16 prompts, got 17" in capsys.readouterr().err
    assert main(["tune", str(tiny_model), "--knobs", "colour", "--no-save"]) == 2
    assert "--knobs: colour cannot be turned here" in capsys.readouterr().err
