"""Property tests (hypothesis): hostile headers, configs, tokenizer files, state files and chat messages either
work or raise a K3Error naming the problem — never another exception, never a hang. `make test` runs a bounded
number of examples; `make fuzz` runs them for minutes (tests/fuzz/conftest.py)."""
from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from k3core.testmodel.make import _tokenizer_files, config_json, shape_config

from . import targets

JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
                      st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
JSON = st.recursive(JSON_LEAF, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                                                          max_size=4), max_leaves=12)
DTYPES = st.sampled_from(["F32", "BF16", "F16", "U8", "I64", "F8_E4M3", "BOOL", "f32", ""])
NAMES = st.text(alphabet=st.characters(codec="utf-8"), max_size=20) | st.sampled_from(["a", "a\\\\b", "é", '"q"'])


def entries():
    number = st.integers(min_value=-3, max_value=2**64) | st.sampled_from([0, 4, 8, 16, 10**17])
    entry = st.fixed_dictionaries({"dtype": DTYPES, "shape": st.lists(number, max_size=3),
                                   "data_offsets": st.lists(number, min_size=0, max_size=3)}) | JSON
    return st.dictionaries(NAMES, entry, max_size=5)


@given(entries(), st.sampled_from(["compact", "spaced"]), st.booleans())
def test_header_parsers_agree_and_refuse_cleanly(header, layout, metadata):
    if metadata:
        header = {"__metadata__": {"format": "pt"}, **header}
    raw = json.dumps(header, separators=(",", ":") if layout == "compact" else None, allow_nan=True).encode()
    targets.header(raw + b" " * (-len(raw) % 8))


@given(st.binary(max_size=300))
def test_header_bytes(raw):
    targets.header(raw or b"{}")


def base_config(layout="nested"):
    return config_json(shape_config("tiny"), layout)


@given(st.sampled_from(["nested", "flat"]), st.lists(st.tuples(st.text(max_size=30), JSON), max_size=4),
       st.lists(st.text(max_size=30), max_size=3))
def test_configs_load_or_say_what_is_wrong(layout, changes, removals):
    raw = base_config(layout)
    root = raw.get("text_config", raw)
    keys = list(root) + list(root.get("linear_attn_config", {}))
    for key, value in changes:
        root[keys[hash(key) % len(keys)] if key else "hidden_size"] = value
    for key in removals:
        root.pop(keys[hash(key) % len(keys)], None)
    targets.config(json.dumps(raw, allow_nan=True).encode())


@given(st.binary(max_size=400))
def test_config_bytes(raw):
    targets.config(raw)


TOKENIZER = {k: v.encode() for k, v in _tokenizer_files(shape_config("small")).items()}


@given(st.sampled_from(["tiktoken.model", "tokenizer_config.json"]),
       st.lists(st.tuples(st.integers(0, 10**6), st.binary(max_size=24)), min_size=1, max_size=4))
def test_tokenizer_files_load_or_are_refused(which, edits):
    data = bytearray(TOKENIZER[which])
    for at, piece in edits:
        at %= max(1, len(data))
        data[at:at + len(piece)] = piece
    targets.tokenizer({**TOKENIZER, which: bytes(data)})


@given(st.lists(st.tuples(st.binary(min_size=1, max_size=6), st.integers(-2, 2**40)), max_size=6),
       st.dictionaries(st.sampled_from(["added_tokens_decoder", "chat_template", "bos_token"]), JSON, max_size=3))
def test_tokenizer_from_scratch(ranks, config):
    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    lines += [f"{base64.b64encode(t).decode()} {r}" for t, r in ranks]
    targets.tokenizer({"tiktoken.model": "\n".join(lines).encode(),
                       "tokenizer_config.json": json.dumps(config, allow_nan=True).encode()})


@pytest.fixture(scope="module")
def engine(tiny_model):
    from k3core import EngineConfig, open_engine

    with open_engine(EngineConfig(tiny_model)) as e:
        yield e


@pytest.fixture(scope="module")
def good_state(engine, tmp_path_factory):
    from k3core.model.state_file import save_state

    state = engine.new_state()
    engine.forward([5, 6, 7], state)
    path = tmp_path_factory.mktemp("state") / "s.npz"
    save_state(path, engine, state, extra={"conversation": {}})
    return path.read_bytes()


@given(data=st.data())
def test_state_files_load_or_are_refused(engine, good_state, data):
    raw = bytearray(good_state)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        if data.draw(st.booleans()):
            raw[at] ^= data.draw(st.integers(1, 255))
        else:
            del raw[at:]
            break
    targets.state_file(bytes(raw), engine)


@given(st.binary(max_size=200))
def test_state_bytes(engine, raw):
    targets.state_file(raw, engine)


MARKUP = st.sampled_from(["<|open|>", "<|sep|>", "<|close|>", "<|end_of_msg|>", "[EOS]", "{{", "{%", "\x00", "\u2028"])
TEXT = st.lists(st.text(max_size=10) | MARKUP, max_size=5).map("".join)


@pytest.fixture(scope="module")
def chat_tokenizer(small_model):
    from k3core import load_tokenizer

    return load_tokenizer(small_model)


@given(st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "tool", "bot", 3])},
                                      optional={"content": TEXT | JSON, "thinking": TEXT, "tools": TEXT,
                                                "name": TEXT}) | JSON, max_size=4),
       st.sampled_from(["instruct", "thinking", "chat"]))
def test_chat_messages_render_or_are_refused(chat_tokenizer, messages, mode):
    targets.chat(messages, chat_tokenizer, mode)
