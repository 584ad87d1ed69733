"""The tokenizer against tiktoken's own Encoding built here, independently, from the same files:
token-for-token agreement, byte round trips, added tokens in raw text (both modes), streaming
decode that never splits a character, pat_str from tokenization_kimi.py, and bad files refused."""
import base64
import json
import random
import shutil

import numpy as np
import pytest
import tiktoken
from tiktoken.load import load_tiktoken_bpe

from k3core.format.config import load_config
from k3core.errors import InputError, TokenizerError
from k3core.testmodel.make import BPE_CORPUS, SPECIAL_TOKENS, _tokenizer_files, shape_config
from k3core.text.tokenizer import PAT_STR, StreamDecoder, load_tokenizer

# MODEL.md §7's eight alternatives, written out again here rather than imported.
SPEC_ALTERNATIVES = [
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",  # noqa: E501
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",  # noqa: E501
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
]
SPEC_PAT = "|".join(SPEC_ALTERNATIVES)

SAMPLES = {
    "empty": "",
    "cjk": "今天天气很好，我们去公园散步吧。日本語の文章もそうです。",
    "emoji_zwj": "A developer 👩‍💻 and a family 👨‍👩‍👧, flag 🏳️‍🌈 👋🏽",
    "accents": "crème brûlée, piña colada, Straße, Ça va? São Paulo, Ωμέγα, Привет",
    "contractions": "I'll go, you'd stay. DON'T PANIC! They've said it's fine; we're OK.",
    "digits": "12345678 and 1,250,000 at 08:45; 7 cats",
    "whitespace": "a  b   c\t\td    \t e     ",
    "newlines": "line one\n\nline two\r\n\r\n   \n  indented\n",
    "mixed": "The café 東京 costs ¥1200 🎉\n\tdon't\u00a0stop",
}


def reference_encoding(directory, pat=SPEC_PAT):
    """tiktoken's Encoding, built straight from the files with tiktoken's own loader."""
    ranks = load_tiktoken_bpe(str(directory / "tiktoken.model"))
    decoder = json.loads((directory / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    specials = {entry["content"]: int(i) for i, entry in decoder.items()}
    return tiktoken.Encoding("reference", pat_str=pat, mergeable_ranks=ranks, special_tokens=specials)


@pytest.fixture(scope="module", params=["tiny", "small", "medium"])
def shaped(request, tmp_path_factory):
    """(directory with the shape's tokenizer files, its vocab_size)."""
    c = shape_config(request.param)
    directory = tmp_path_factory.mktemp(f"tok-{request.param}")
    for name, text in _tokenizer_files(c).items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory, c.vocab_size


def test_the_spec_pattern_is_the_one_we_use():
    assert PAT_STR == SPEC_PAT


@pytest.mark.parametrize("name", SAMPLES)
def test_agrees_with_tiktoken_and_round_trips(shaped, name):
    directory, _ = shaped
    tok, ref, text = load_tokenizer(directory), reference_encoding(directory), SAMPLES[name]
    ids = tok.encode(text)
    assert ids == ref.encode(text, disallowed_special=())
    assert tok.encode(text, allow_special=True) == ref.encode(text, allowed_special="all")
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8")
    assert tok.decode(ids) == text


def test_vocabulary_layout(shaped):
    directory, vocab_size = shaped
    tok = load_tokenizer(directory)
    assert tok.vocab_size == vocab_size
    if vocab_size == 256:  # tiny: bytes only, no room for added tokens
        assert tok.n_ranks == 256 and tok.added_tokens == {} and tok.special_ids == frozenset()
        return
    assert list(tok.added_tokens) == SPECIAL_TOKENS
    assert sorted(tok.added_tokens.values()) == list(range(tok.n_ranks, vocab_size))
    assert tok.special_ids == frozenset(tok.added_tokens.values())
    assert len(tok.encode(" the quick brown fox")) < len(" the quick brown fox")  # the merges are used


def test_generated_checkpoint_tokenizer_matches_its_config(small_model):
    tok = load_tokenizer(small_model)
    assert tok.vocab_size == load_config(small_model).vocab_size
    decoder = json.loads((small_model / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    assert tok.id_of("[BOS]") == min(int(i) for i in decoder)  # ids read from the file
    assert tok.encode("hello") and tok.encode("hello")[0] != tok.id_of("[BOS]")  # no BOS added


def test_added_tokens_in_raw_text(shaped):
    directory, _ = shaped
    tok, ref = load_tokenizer(directory), reference_encoding(directory)
    text = "<|open|>response<|sep|>Hi [EOS] there<|close|>response<|sep|><|end_of_msg|>"
    plain = tok.encode(text)
    assert not set(plain) & set(tok.added_tokens.values())  # default: ordinary text
    assert tok.decode(plain) == text
    marked = tok.encode(text, allow_special=True)
    assert marked == ref.encode(text, allowed_special="all")
    assert tok.decode(marked) == text
    if not tok.added_tokens:
        assert marked == plain
        with pytest.raises(TokenizerError, match="no added token"):
            tok.id_of("<|open|>")
        return
    ids = {c: tok.id_of(c) for c in ("<|open|>", "<|sep|>", "<|close|>", "<|end_of_msg|>", "[EOS]")}
    assert marked[0] == ids["<|open|>"] and marked[-1] == ids["<|end_of_msg|>"]
    assert [t for t in marked if t in tok.special_ids] == [ids[c] for c in (
        "<|open|>", "<|sep|>", "[EOS]", "<|close|>", "<|sep|>", "<|end_of_msg|>")]


def test_stream_decode_holds_back_split_characters(tiny_model):
    tok = load_tokenizer(tiny_model)  # byte-level: every multi-byte character spans tokens
    text = "é日👩‍💻!"
    ids = tok.encode(text)
    assert len(ids) == len(text.encode())
    stream = StreamDecoder(tok)
    outs = [stream.push(i) for i in ids]
    assert outs[:6] == ["", "é", "", "", "日", ""]  # 2 bytes, then 3
    assert all("\ufffd" not in o for o in outs)
    assert "".join(outs) + stream.flush() == text
    stream.push(ids[2])  # an unfinished character is not emitted; flush reports it
    assert stream.flush() == "\ufffd" and stream.push(ids[0]) == ""


def test_stream_decode_with_merged_tokens(shaped):
    directory, _ = shaped
    tok = load_tokenizer(directory)
    text = SAMPLES["cjk"] + SAMPLES["emoji_zwj"]
    ids = tok.encode(text)
    alone = [tok.token_bytes(i) for i in ids]
    assert any(_not_utf8(b) for b in alone)  # some character really does span tokens
    stream = tok.stream()
    outs = [stream.push(i) for i in ids]
    assert all("\ufffd" not in o for o in outs) and "".join(outs) + stream.flush() == text


def _not_utf8(b):
    try:
        b.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def test_stream_decode_equals_decode_on_any_ids(shaped):
    directory, _ = shaped
    tok, rng = load_tokenizer(directory), random.Random(0)
    valid = list(range(tok.n_ranks)) + list(tok.added_tokens.values())
    for _ in range(200):
        ids = [rng.choice(valid) for _ in range(rng.randint(0, 12))]
        stream = tok.stream()
        assert "".join(stream.push(i) for i in ids) + stream.flush() == tok.decode(ids)


def test_ids_outside_the_vocabulary_are_refused(shaped):
    directory, vocab_size = shaped
    tok = load_tokenizer(directory)
    for bad in (vocab_size, -1):
        with pytest.raises(InputError, match=f"token id {bad} is not in the vocabulary"):
            tok.decode([65, bad])
        with pytest.raises(InputError):
            tok.stream().push(bad)
    with pytest.raises(InputError, match="not an integer"):
        tok.decode([65.0])
    assert tok.decode(np.array([72, 105])) == tok.decode([72, 105])  # numpy ids are fine


def test_trainer_splits_like_tiktoken():
    """testmodel's trainer pre-splits with `regex` (V1); tiktoken's engine must split the same.
    With every substring of the corpus in the vocabulary, tiktoken's tokens ARE its pieces."""
    import regex
    data = BPE_CORPUS.encode()
    subs = {data[i:j] for i in range(len(data)) for j in range(i + 2, min(len(data), i + 64) + 1)}
    ranks = {bytes([b]): b for b in range(256)}
    ranks.update((s, 256 + r) for r, s in enumerate(sorted(subs)))
    enc = tiktoken.Encoding("pieces", pat_str=SPEC_PAT, mergeable_ranks=ranks, special_tokens={})
    pieces = [enc.decode_single_token_bytes(t).decode() for t in enc.encode_ordinary(BPE_CORPUS)]
    assert pieces == regex.findall(PAT_STR, BPE_CORPUS, flags=regex.V1)


def test_merges_fill_the_room_deterministically():
    for shape, merges in (("tiny", 0), ("small", 384 - 256 - 12), ("medium", 512 - 256 - 12)):
        files = _tokenizer_files(shape_config(shape))
        assert files == _tokenizer_files(shape_config(shape))
        assert len(files["tiktoken.model"].splitlines()) == 256 + merges


# --- pat_str from a shipped tokenization_kimi.py -------------------------------------------

KIMI_LIKE = '''
import nonexistent_module_that_would_fail
raise SystemExit("this file must never be executed")

class TikTokenTokenizer:
    num_reserved_special_tokens = 256
    pat_str = "|".join(
        [
%s
        ]
    )
'''


@pytest.fixture
def small_dir(tmp_path):
    for name, text in _tokenizer_files(shape_config("small")).items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    return tmp_path


def test_kimi_style_pat_str_is_read_without_running_the_file(small_dir):
    body = "\n".join(f'            r"""{a}""",' for a in SPEC_ALTERNATIVES)
    (small_dir / "tokenization_kimi.py").write_text(KIMI_LIKE % body)
    tok = load_tokenizer(small_dir)
    assert tok.pat_source.endswith("tokenization_kimi.py")
    assert tok.encode(SAMPLES["mixed"]) == reference_encoding(small_dir).encode_ordinary(SAMPLES["mixed"])


def test_the_shipped_pat_str_wins(small_dir):
    other = r"\S|\s+"  # every visible character alone: no merge can span two of them
    (small_dir / "tokenization_kimi.py").write_text(KIMI_LIKE % f'            r"""{other}""",')
    tok, text = load_tokenizer(small_dir), " the quick brown fox didn't"
    assert tok.encode(text) == reference_encoding(small_dir, other).encode_ordinary(text)
    assert tok.encode(text) != reference_encoding(small_dir).encode_ordinary(text)
    assert len(tok.encode(text)) >= len(text.replace(" ", ""))


@pytest.mark.parametrize("source, message", [
    ("import re\npat_str = build_pattern()\n", "not a string literal"),
    ("class T:\n    pat_str = f'{X}|a'\n", "not a string literal"),
    ("class T:\n    pattern = 'a'\n", "no assignment to pat_str"),
    ("pat_str = 'a'\npat_str = 'b'\n", "different values"),
    ("pat_str = (\n", "cannot parse"),
    ("pat_str = '[a'\n", "tiktoken rejects"),
])
def test_unusable_tokenization_kimi_is_refused(small_dir, source, message):
    (small_dir / "tokenization_kimi.py").write_text(source)
    with pytest.raises(TokenizerError, match=message) as e:
        load_tokenizer(small_dir)
    assert "tokenization_kimi.py" in str(e.value) and e.value.exit_code == 2


# --- bad files -----------------------------------------------------------------------------

def _b64(b):
    return base64.b64encode(b).decode()


def _edit_ranks(directory, edit):
    path = directory / "tiktoken.model"
    path.write_text("".join(edit(path.read_text().splitlines(keepends=True))))


def _edit_added(directory, edit):
    path = directory / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    edit(cfg["added_tokens_decoder"])
    path.write_text(json.dumps(cfg))


BAD = {
    "missing ranks": ("tiktoken.model", "cannot read", lambda d: (d / "tiktoken.model").unlink()),
    "empty ranks": ("tiktoken.model", "no BPE ranks", lambda d: (d / "tiktoken.model").write_text("")),
    "not base64": ("tiktoken.model:3", "expected 'base64",
                   lambda d: _edit_ranks(d, lambda ls: ls[:2] + ["!!!! 2\n"] + ls[3:])),
    "rank not int": ("tiktoken.model:3", "expected 'base64",
                     lambda d: _edit_ranks(d, lambda ls: ls[:2] + [f"{_b64(bytes([2]))} two\n"] + ls[3:])),
    "three fields": ("tiktoken.model:1", "expected 'base64",
                     lambda d: _edit_ranks(d, lambda ls: ["AA== 0 0\n"] + ls[1:])),
    "binary junk": ("tiktoken.model", "expected 'base64",
                    lambda d: (d / "tiktoken.model").write_bytes(b"\x00\xff\xfe garbage\n")),
    "duplicate rank": ("tiktoken.model:300", "rank 5 already given on line 6",
                       lambda d: _edit_ranks(d, lambda ls: ls[:299] + [f"{_b64(b'zz')} 5\n"] + ls[300:])),
    "duplicate token": ("tiktoken.model:300", "already has rank",
                        lambda d: _edit_ranks(d, lambda ls: ls[:299] + [f"{_b64(b'a')} 299\n"] + ls[300:])),
    "rank gap": ("tiktoken.model", "rank 299 is missing",
                 lambda d: _edit_ranks(d, lambda ls: ls[:299] + ls[300:])),
    "missing byte": ("tiktoken.model", "single-byte token",
                     lambda d: _edit_ranks(d, lambda ls: ls[:7] + [f"{_b64(b'qq')} 7\n"] + ls[8:])),
    "missing config": ("tokenizer_config.json", "cannot read", lambda d: (d / "tokenizer_config.json").unlink()),
    "config not json": ("tokenizer_config.json", "not valid JSON",
                        lambda d: (d / "tokenizer_config.json").write_text("{added_tokens")),
    "config not an object": ("tokenizer_config.json", "expected a JSON object",
                             lambda d: (d / "tokenizer_config.json").write_text("[1, 2]")),
    "added id collides": ("tokenizer_config.json", "collides with a BPE rank",
                          lambda d: _edit_added(d, lambda a: a.update({"100": {"content": "<|x|>", "special": True}}))),
    "added id not a number": ("tokenizer_config.json", "expected a decimal id",
                              lambda d: _edit_added(d, lambda a: a.update({"x1": {"content": "<|x|>"}}))),
    "added content twice": ("tokenizer_config.json", "already has id",
                            lambda d: _edit_added(d, lambda a: a.update({"999": {"content": "[BOS]"}}))),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_files_are_refused_with_the_file_named(small_dir, case):
    where, message, damage = BAD[case]
    damage(small_dir)
    with pytest.raises(TokenizerError, match=message) as e:
        load_tokenizer(small_dir)
    assert str(small_dir / where) in str(e.value) and e.value.exit_code == 2


def test_tokenizer_of_the_tiny_fixture_is_untouched(tiny_model, tmp_path):
    """The pinned tiny files load; a copy without tokenization_kimi.py uses the pattern of MODEL.md §7."""
    shutil.copy(tiny_model / "tiktoken.model", tmp_path)
    shutil.copy(tiny_model / "tokenizer_config.json", tmp_path)
    tok = load_tokenizer(tmp_path)
    assert tok.pat_source == "MODEL.md §7" and tok.vocab_size == 256
    assert tok.encode("DON'T") == list(b"DON'T")


def test_a_pat_str_that_makes_tiktoken_panic_is_a_named_error_at_load(small_dir):
    (small_dir / "tokenization_kimi.py").write_text(KIMI_LIKE % '            r"""(a*)*\\1""",')
    with pytest.raises(TokenizerError, match=r"tokenization_kimi.py: the pat_str fails on this text \(PanicException"):
        load_tokenizer(small_dir)
