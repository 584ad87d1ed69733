"""What `k3 run` is given besides the prompt, refused before it generates: a replay draft file read with a byte limit
(/dev/zero too) and checked whole against the vocabulary, a --stop-id outside the vocabulary, a float flag of any
command that is nan, inf or negative, an added token's id past the bound on a vocabulary. Each row asserts exit 2
and that the message names the flag or file, the value and the bound; nothing streams before the error."""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

import pytest

from k3core.cli.main import build_parser, main

RUN = ["--ids", "1,2", "--gen", "3", "--quiet"]
SPECULATE = ["--speculate", "2", "--draft"]


def row(case, *values, full=False):
    return pytest.param(*values, id=case, marks=[pytest.mark.faults_full] if full else [])


def k3(argv):
    """main(argv), an argparse refusal (SystemExit) as its exit code."""
    try:
        return main([str(a) for a in argv])
    except SystemExit as exc:
        return exc.code


def replay(text):
    def setup(t):
        (t / "ids.txt").write_text(text)
        return [*SPECULATE, f"replay:{t / 'ids.txt'}"]
    return setup


def sparse(t):
    with open(t / "big.txt", "wb") as f:
        f.truncate((16 << 20) + 1)
    return [*SPECULATE, f"replay:{t / 'big.txt'}"]


# (setup(tmp_path) -> flags after RUN, needle ({t}: tmp_path))
RUN_CASES = [
    row("replay-an-id-outside-the-vocabulary", replay("5 6 99999 7"),
        "--draft replay:{t}/ids.txt: id 99999 at position 2 (counting from 0) is outside this model's vocabulary of "
        "256 ids (0..255)"),
    row("replay-the-first-id-past-the-vocabulary", replay("256"), "id 256 at position 0", full=True),
    row("replay-an-id-of-5000-digits", replay("1 " + "9" * 5000), "id 99999999999999999999… at position 1", full=True),
    row("replay-a-file-over-the-limit", sparse,
        "{t}/big.txt: more than 16 MiB, the limit of a replay draft file (--draft replay:PATH)", full=True),
    row("stop-id-outside-the-vocabulary", lambda t: ["--stop-id", "999999"],
        "--stop-id 999999: not a token id of this model, whose vocabulary is 256 ids (0..255)"),
    row("stop-id-one-past-the-vocabulary", lambda t: ["--stop-id", "5", "--stop-id", "256"], "--stop-id 256:", full=True),
    row("draft-memory-nan", lambda t: [*SPECULATE, "suffix", "--draft-memory", "nan"],
        "argument --draft-memory: takes GB >= 0, a finite number; got 'nan'"),
    row("draft-memory-inf", lambda t: [*SPECULATE, "suffix", "--draft-memory", "inf"],
        "argument --draft-memory: takes GB >= 0, a finite number; got 'inf'"),
    row("draft-memory-negative", lambda t: [*SPECULATE, "suffix", "--draft-memory", "-1"], "argument --draft-memory:",
        full=True),
    row("temperature-nan", lambda t: ["--temperature", "nan"], "argument --temperature: takes T >= 0", full=True),
    row("cache-gb-inf", lambda t: ["--cache-gb", "inf"], "argument --cache-gb: takes GB >= 0", full=True),
    row("disk-floor-nan", lambda t: ["--disk-floor", "nan"], "argument --disk-floor: takes seconds > 0", full=True),
]


@pytest.mark.parametrize("setup, needle", RUN_CASES)
def test_run_refuses(capsys, tiny_model, tmp_path, setup, needle):
    got = k3(["run", tiny_model, *RUN, *setup(tmp_path)])
    out, err = capsys.readouterr()
    assert got == 2 and needle.format(t=tmp_path) in err and "Traceback" not in err, err
    assert out == ""  # refused before anything was generated


def test_replay_from_dev_zero_is_refused_at_the_limit(tiny_model):
    """/dev/zero has no size: read past the limit it is refused, not read until memory runs out (a child with a
    deadline and an address-space cap, so a regression fails the row instead of the machine)."""
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    soft = 4 << 30 if hard == resource.RLIM_INFINITY else min(4 << 30, hard)
    cap = lambda: resource.setrlimit(resource.RLIMIT_AS, (soft, hard))  # noqa: E731
    done = subprocess.run([sys.executable, "-m", "k3core", "run", str(tiny_model), *RUN, *SPECULATE, "replay:/dev/zero"],
                          capture_output=True, text=True, timeout=120, preexec_fn=cap)
    assert done.returncode == 2, done.stderr
    assert "/dev/zero: more than 16 MiB, the limit of a replay draft file (--draft replay:PATH)" in done.stderr


def _parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from _parsers(sub)


def test_every_float_flag_of_every_command_refuses_nan_inf_and_negative():
    """The audit: no flag of k3 or of the plugins that load (the wizard, the UI, the server) parses with bare float,
    which takes nan and inf; each float flag's type refuses them, naming nothing itself (argparse names the flag)."""
    floats = []
    for parser in _parsers(build_parser()):
        for action in parser._actions:
            assert action.type is not float, f"{parser.prog} {action.option_strings}: type=float takes nan and inf"
            if getattr(action.type, "__module__", "") == "k3core.cli.options" and action.type.__name__ != "_context":
                floats.append((parser.prog, action.option_strings, action.type))
    assert len(floats) >= 20, floats
    for prog, flags, parse in floats:
        for bad in ("nan", "inf", "-inf", "-1", "x"):
            with pytest.raises(argparse.ArgumentTypeError):
                parse(bad)
                pytest.fail(f"{prog} {flags} takes {bad}")


# (command line, needle): float flags of other commands, end to end
OTHER_COMMANDS = [
    row("setup-stall-inf", ["setup", "--stall", "inf"], "argument --stall: takes seconds > 0"),
    row("bench-project-disk-nan", ["bench", "project", "--disk", "nan"], "argument --disk: takes GB/s > 0", full=True),
    row("bench-kernels-seconds-negative", ["bench", "kernels", "--seconds", "-1"], "argument --seconds:", full=True),
]


@pytest.mark.parametrize("argv, needle", OTHER_COMMANDS)
def test_other_commands_refuse_a_float_flag(capsys, argv, needle):
    assert k3(argv) == 2
    assert needle in capsys.readouterr().err


def tokenizer_with(t, model, key):
    tok = t / "tok"
    tok.mkdir()
    os.symlink(model / "tiktoken.model", tok / "tiktoken.model")
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"] = {key: {"content": "<|x|>", "special": True}}
    (tok / "tokenizer_config.json").write_text(json.dumps(config))
    return tok


# (the added token's id, needle ({path}: the tokenizer_config.json))
TOKENIZER_CASES = [
    row("added-token-id-10^12", "1000000000000",
        "{path}: added_tokens_decoder['1000000000000']: id 1000000000000 is past the bound on a vocabulary: ids must "
        "be below 16,777,216"),
    row("added-token-id-2^24", str(1 << 24), "added_tokens_decoder['16777216']: id 16777216 is past the bound",
        full=True),
    row("added-token-id-of-5000-digits", "7" * 5000, "id 77777777777777777777 is past the bound", full=True),
]


@pytest.mark.parametrize("key, needle", TOKENIZER_CASES)
def test_an_added_token_id_past_the_bound(capsys, tiny_model, tmp_path, key, needle):
    tok = tokenizer_with(tmp_path, tiny_model, key)
    got = k3(["run", tiny_model, "--tok", tok, "--prompt", "hi", "--gen", "1", "--quiet"])
    out, err = capsys.readouterr()
    assert got == 2 and needle.format(path=tok / "tokenizer_config.json") in err and out == "", err
