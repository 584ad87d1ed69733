"""Mistakes people make at the `k3` command line (issue 28), each refused or hinted with the exact text the user
sees: a misspelled or abbreviated flag, a mistyped MODEL_DIR, more --threads than CPUs, the repository's demo/
training folder (or any source folder) given as a model, a raw completion of a chat model without --chat, and a
mistyped subcommand (issue 42)."""
import argparse
import json
import os
import shlex
import shutil
from types import SimpleNamespace

import pytest

from k3core.cli.main import Parser, build_parser, main
from k3core.plan.profile import Profile, save_profile

from ..conftest import DEMO_MODEL

REPO = DEMO_MODEL.parents[2]


def refused(capsys, *argv):
    """(exit code, stderr) of a command argparse refuses (it exits)."""
    with pytest.raises(SystemExit) as exited:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert out == ""
    return exited.value.code, err


def run_k3(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def no_profile(tmp_path, monkeypatch):
    monkeypatch.setenv("K3_CONFIG_DIR", str(tmp_path / "config"))


# 1. a misspelled or abbreviated flag: the subcommand's usage line and the closest of its flags, exit 2

def test_a_misspelled_flag_gets_the_subcommands_usage_and_the_flag_it_meant(capsys):
    assert refused(capsys, "run", "--temprature", "0.5") == (2, (
        "usage: k3 run [options] [MODEL_DIR] [PROMPT]   (`k3 run --help` lists them)\n"
        "k3 run: error: unrecognized argument --temprature; did you mean --temperature?\n"))


def test_an_abbreviated_flag_is_refused_not_taken_for_the_longer_one(capsys):
    assert refused(capsys, "run", "--ids", "1", "--max-token", "3") == (2, (
        "usage: k3 run [options] [MODEL_DIR] [PROMPT]   (`k3 run --help` lists them)\n"
        "k3 run: error: unrecognized argument --max-token; did you mean --max-tokens?\n"))
    assert refused(capsys, "run", "--ids", "1", "--max-token=3")[1].endswith(
        "k3 run: error: unrecognized argument --max-token=3; did you mean --max-tokens?\n")


def test_a_plugins_subcommand_refuses_a_misspelled_flag_the_same_way(capsys):
    assert refused(capsys, "serve", "--prot", "8080") == (2, (
        "usage: k3 serve [options] [MODEL_DIR]   (`k3 serve --help` lists them)\n"
        "k3 serve: error: unrecognized argument --prot; did you mean --port?\n"))


def test_a_mistyped_subcommand_gets_the_command_it_meant(capsys):
    assert refused(capsys, "chatt") == (2, (
        "usage: k3 [options] COMMAND ...   (`k3 --help` lists them)\n"
        "k3: error: unknown command 'chatt'; did you mean `k3 chat`?\n"))
    assert refused(capsys, "bench", "strem") == (2, (
        "usage: k3 bench [options] BENCH ...   (`k3 bench --help` lists them)\n"
        "k3 bench: error: unknown command 'strem'; did you mean `k3 bench stream`?\n"))
    code, err = refused(capsys, "xyzzy")  # nothing close: argparse's list of them all
    assert code == 2 and "k3: error: argument COMMAND: invalid choice: 'xyzzy' (choose from 'run', 'chat', " in err


def test_an_extra_word_is_refused_with_the_subcommands_usage(capsys):
    assert refused(capsys, "make-model", "a", "b") == (2, (
        "usage: k3 make-model [options] DIR   (`k3 make-model --help` lists them)\n"
        "k3 make-model: error: unrecognized arguments: b\n"))


def test_every_parser_refuses_abbreviations_plugins_subcommands_too():
    def walk(parser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    yield from walk(child)

    parsers = {p.prog: p for p in walk(build_parser())}
    assert {"k3", "k3 run", "k3 chat", "k3 bench stream", "k3 serve", "k3 ui", "k3 setup"} <= set(parsers)
    assert all(isinstance(p, Parser) and p.allow_abbrev is False for p in parsers.values())
    assert Parser(allow_abbrev=True).allow_abbrev is False  # a plugin asking for them does not get them


def test_help_still_gives_the_whole_usage(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0 and out.startswith("usage: k3 run [-h] [--kernels NAME] [--threads N]")
    assert "at most the CPUs this process may use" in out


# 2. a mistyped MODEL_DIR: the close directory names beside it, never a flag already given

def test_a_mistyped_model_dir_suggests_the_directory_it_meant(capsys, tmp_path, monkeypatch):
    (tmp_path / "demo-model").mkdir()
    (tmp_path / "notes.txt").write_text("a file is no model directory")
    code, out, err = run_k3(capsys, "run", tmp_path / "demo-modle", "--prompt", "hi")
    assert (code, out, err) == (2, "", f"k3: error: MODEL_DIR {tmp_path}/demo-modle: no such directory; "
                                       f"did you mean {tmp_path}/demo-model?\n")
    monkeypatch.chdir(tmp_path)
    expected = "k3: error: MODEL_DIR demo-modle: no such directory; did you mean demo-model?\n"
    assert run_k3(capsys, "run", "demo-modle", "--prompt", "hi") == (2, "", expected)
    assert run_k3(capsys, "run", "demo-modle", "hi") == (2, "", expected)
    assert run_k3(capsys, "chat", "demo-modle") == (2, "", expected)


def test_a_missing_model_dir_with_nothing_close_suggests_no_flag_already_given(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_k3(capsys, "run", "elsewhere", "--prompt", "hi") == (
        2, "", "k3: error: MODEL_DIR elsewhere: no such directory\n")
    assert run_k3(capsys, "run", "hello", "world") == (
        2, "", "k3: error: MODEL_DIR hello: no such directory; a prompt of several words is one argument: quote it "
               "(k3 run 'hello world')\n")


# 3. more --threads than this process may use

def test_more_threads_than_cpus_is_refused_naming_the_cpus(capsys, tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert run_k3(capsys, "run", tiny_model, "--ids", "1", "--threads", "999", "--json", tmp_path / "r.json") == (
        2, "", "k3: error: --threads 999: this process may use 2 CPUs; give --threads 1..2, or leave it out to use "
               "all 2\n")
    assert run_k3(capsys, "chat", tiny_model, "--threads", "3")[2] == (
        "k3: error: --threads 3: this process may use 2 CPUs; give --threads 1..2, or leave it out to use all 2\n")
    assert not (tmp_path / "r.json").exists()


# 4. the repository's demo/ training folder, or a source folder, given as MODEL_DIR

def test_the_demo_training_folder_is_not_a_model_and_the_shipped_demo_model_is_named(capsys, tmp_path, monkeypatch,
                                                                                    no_profile):
    monkeypatch.chdir(tmp_path)
    expected = (f"k3: error: MODEL_DIR {REPO}/demo: not a model but k3's demo training folder (its train.py trains "
                "the demo model); `k3 setup --source demo --yes` installs the demo model and saves it as the "
                f"profile, or give its shipped copy, {DEMO_MODEL}, as MODEL_DIR\n")
    assert run_k3(capsys, "run", REPO / "demo", "--prompt", "hi") == (2, "", expected)
    assert run_k3(capsys, "chat", REPO / "demo") == (2, "", expected)
    monkeypatch.chdir(REPO)
    assert run_k3(capsys, "chat", "demo") == (
        2, "", "k3: error: MODEL_DIR demo: not a model but k3's demo training folder (its train.py trains the demo "
               "model); `k3 setup --source demo --yes` installs the demo model and saves it as the profile, or give "
               "its shipped copy, wizard/data/demo-model, as MODEL_DIR\n")


def test_the_demo_training_folder_names_the_saved_profiles_demo_model(capsys, tmp_path, no_profile):
    save_profile(Profile(model=str(tmp_path / "demo-model"), source="demo"))
    assert run_k3(capsys, "run", REPO / "demo", "What is 7 + 5?") == (
        2, "", f"k3: error: MODEL_DIR {REPO}/demo: not a model but k3's demo training folder (its train.py trains "
               f"the demo model); the demo model is {tmp_path}/demo-model, the saved profile's: leave MODEL_DIR out "
               "to use it\n")


def test_a_source_folder_is_not_a_model(capsys, tmp_path, monkeypatch, no_profile):
    src = tmp_path / "project"
    src.mkdir()
    for name in ("main.py", "pyproject.toml", "README.md"):
        (src / name).write_text("")
    monkeypatch.chdir(tmp_path)
    assert run_k3(capsys, "run", "project", "--prompt", "hi") == (
        2, "", "k3: error: MODEL_DIR project: not a model but a source folder (main.py, pyproject.toml; no "
               "config.json); a model directory holds config.json and safetensors shards. `k3 setup --source demo "
               f"--yes` installs the demo model and saves it as the profile, or give its shipped copy, {DEMO_MODEL}, "
               "as MODEL_DIR\n")


# 5. a text prompt to a chat model without --chat: one hint line on stderr before the raw completion

@pytest.fixture
def chat_model(tiny_model, tmp_path):
    """The tiny test model with a chat template in its tokenizer_config.json: a chat model, to k3 run."""
    model = shutil.copytree(tiny_model, tmp_path / "chat model")
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": "{{ messages }}"}))
    return model


def test_a_raw_prompt_to_a_chat_model_gets_one_hint_before_generating(capsys, chat_model):
    code, out, err = run_k3(capsys, "run", chat_model, "What is the capital of France?", "--gen", "2")
    hint = (f"k3: this model chats; for an answer try: k3 run {shlex.quote(str(chat_model))} --chat 'What is the "
            f"capital of France?'  (or k3 chat {shlex.quote(str(chat_model))})")
    assert code == 0 and err.splitlines().count(hint) == 1
    assert err.index(hint) < err.index("prompt 30 ids, generated 2")  # before the run report


def test_no_hint_with_chat_or_quiet(capsys, chat_model):
    code, _, err = run_k3(capsys, "run", chat_model, "Hello", "--gen", "1", "--quiet")
    assert code == 0 and "this model chats" not in err
    code, _, err = run_k3(capsys, "run", DEMO_MODEL, "Hello", "--gen", "1", "--chat")  # the tiny one has no markup
    assert code == 0 and "this model chats" not in err
    code, _, err = run_k3(capsys, "run", DEMO_MODEL, "Hello", "--gen", "1")
    assert code == 0 and f"k3: this model chats; for an answer try: k3 run {DEMO_MODEL} --chat Hello  (or k3 chat " \
        f"{DEMO_MODEL})\n" in err


def test_no_hint_for_a_model_that_does_not_chat_or_an_ids_prompt(capsys, tiny_model, chat_model):
    assert "this model chats" not in run_k3(capsys, "run", tiny_model, "Hello", "--gen", "1")[2]
    assert "this model chats" not in run_k3(capsys, "run", chat_model, "--ids", "1,2", "--gen", "1")[2]


def test_the_chat_markup_tokens_alone_make_a_chat_model():
    from k3core.cli.run import chats

    markup = {"<|open|>": 1, "<|sep|>": 2, "<|close|>": 3, "<|end_of_msg|>": 4}
    assert chats(SimpleNamespace(config={}, added_tokens=markup))
    assert not chats(SimpleNamespace(config={}, added_tokens={"[BOS]": 1}))
