"""`k3 bench drafts --transcripts`: teacher-forced draft acceptance on a hand-written three-conversation JSONL
(a rewrite, a tool call answered by a `tool` message, one without a kind) with the demo model's tokenizer. An
oracle's passes match the count by hand, an always-wrong source gives exactly 1.0, ngram gains on the rewrite,
a turn's new prompt ids are what its conversation did not already hold, bad lines are refused naming the line and
the field, and --json has the documented shape."""
import json
import math
from pathlib import Path

import pytest

from k3core import load_tokenizer
from k3core.cli.bench.transcripts import acceptance, kind_census, pass_cost, read_conversations, scored_turns
from k3core.cli.main import main
from k3core.plugin_api import DraftSource
from k3core.text import chat
from k3core.text.chat import tool_call_markup
from k3core.text.openai_messages import MessageError, k3_messages

DEMO = Path(__file__).resolve().parents[3] / "wizard" / "data" / "demo-model"
CALL = {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "notes.txt"}'}}
CONVERSATIONS = [
    {"kind": "rewrite", "messages": [
        {"role": "user", "content": "Rename total to amount:\n\ndef total(xs):\n    return sum(xs)\n\n\n"
                                    "print(total([1, 2, 3]))\n"},
        {"role": "assistant", "content": "Here it is:\n\ndef amount(xs):\n    return sum(xs)\n\n\n"
                                         "print(amount([1, 2, 3]))\n"}]},
    {"kind": "tool_loop", "messages": [
        {"role": "system", "content": "You can call read_file(path)."},
        {"role": "user", "content": "What is in notes.txt?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"text": "buy milk, call Ann"}'},
        {"role": "assistant", "content": 'It says: "buy milk, call Ann".'}]},
    {"messages": [{"role": "user", "content": "Hi\u2028there"},  # a line separator, written unescaped
                  {"role": "assistant", "content": "Hello! How can I help?"}]},
]


class Oracle(DraftSource):
    """Proposes the recorded reply of the prompt it began with; `shift` 1 makes every id wrong."""

    name = "oracle"

    def __init__(self, answers: dict, shift: int = 0, vocab: int = 0):
        super().__init__(None)
        self.answers, self.shift, self.vocab = answers, shift, vocab

    def begin(self, prompt):
        self.reply = self.answers[tuple(prompt)]

    def propose(self, history, generated, k):
        return [(t + self.shift) % self.vocab for t in self.reply[generated:generated + k]]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(DEMO)


@pytest.fixture
def transcripts(tmp_path):
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(c, ensure_ascii=False) + "\n" for c in CONVERSATIONS), encoding="utf-8")
    return path


@pytest.fixture
def turns(transcripts, tokenizer):
    return scored_turns(read_conversations(transcripts), tokenizer, transcripts)


def test_turns_are_the_assistant_messages_as_rendered(turns, tokenizer):
    assert [t.kind for t in turns] == ["rewrite", "tool_loop", "tool_loop", "unlabelled"]
    eom = tokenizer.id_of("<|end_of_msg|>")
    assert all(t.reply[-1] == eom and eom not in t.reply[:-1] for t in turns)
    call = tokenizer.decode(turns[1].reply)
    assert 'call tool="read_file"' in call and "notes.txt" in call  # the tool_calls turn, as k3's call markup
    assert '<|open|>tool_result name="read_file"<|sep|>' in tokenizer.decode(turns[2].prompt)  # named by its call id
    assert tokenizer.decode(turns[3].reply).startswith("Hello! How can I help?<|close|>response")


def test_messages_are_read_by_the_one_converter_the_server_uses_too(transcripts):
    """k3core.text.openai_messages reads OpenAI chat messages into k3's (developer is system, text parts joined,
    reasoning_content is thinking, tool_calls k3's markup, a tool message named after its call); a transcript
    line and a chat request get exactly that, and a refusal names the field in both (the server's 400 too)."""
    from serve.schema import ApiError, chat_request

    want = [{"role": "system", "content": "You can call read_file(path)."},
            {"role": "user", "content": "What is in notes.txt?"},
            {"role": "assistant", "content": "", "tools": tool_call_markup([("read_file", {"path": "notes.txt"})])},
            {"role": "tool", "content": '{"text": "buy milk, call Ann"}', "name": "read_file"},
            {"role": "assistant", "content": 'It says: "buy milk, call Ann".'}]
    assert k3_messages(CONVERSATIONS[1]["messages"]) == want
    assert read_conversations(transcripts)[1].messages == want
    assert chat_request({"model": "m", "messages": CONVERSATIONS[1]["messages"]}, 64).messages == tuple(want)
    parts = [{"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
             {"role": "assistant", "content": None, "reasoning_content": "Hm."}]
    assert k3_messages(parts) == [{"role": "system", "content": "Be brief."},
                                  {"role": "assistant", "content": "", "thinking": "Hm."}]
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(MessageError) as refused:
        k3_messages(image)
    assert str(refused.value) == "messages[0].content[0]: only text parts are served, got 'image_url'"
    with pytest.raises(ApiError) as api:
        chat_request({"model": "m", "messages": image}, 64)
    assert (api.value.status, api.value.param, api.value.message) == (400, refused.value.param, str(refused.value))


def test_a_turns_new_prompt_ids_are_those_its_conversation_did_not_already_hold(transcripts, tokenizer):
    """The tool loop's second prompt extends its first prompt and reply: only the tool message and the generation
    prefix are new, after the first turn's ids. A conversation's first turn is all new, after nothing."""
    conversations = read_conversations(transcripts)
    turns = scored_turns(conversations, tokenizer, transcripts)
    loop = conversations[1].messages
    first, second = (len(chat.render(loop[:i], tokenizer)) for i in (2, 4))
    held, whole = (len(chat.render(loop[:i], tokenizer, add_generation_prompt=False)) for i in (3, 5))
    assert 0 < first < held < second  # the first prompt and reply, then the tool message and the prefix
    assert kind_census("tool_loop", conversations, turns) == {
        "conversations": 1, "turns": 2, "reply_ids": (held - first) + (whole - second),
        "prompt_ids": first + (second - held), "context_ids": held}
    rewrite = len(chat.render(conversations[0].messages[:1], tokenizer))
    assert [kind_census("rewrite", conversations, turns)[f] for f in ("prompt_ids", "context_ids")] == [rewrite, 0]


def test_a_rerendered_history_counts_the_ids_past_the_common_prefix_as_new(monkeypatch, tmp_path, tokenizer):
    """A template that renders an assistant message shorter once more follows (as one dropping its thinking
    would): the second prompt shares only the first prompt's ids with the first turn's, the rest is new."""
    def render(messages, tokenizer, mode, *, add_generation_prompt=True):
        ids = []
        for i, m in enumerate(messages):
            last = i == len(messages) - 1
            ids += [1, 2] if m["role"] == "user" else [6, 4, 5] if last else [6, 9]
        return ids + [6] * add_generation_prompt

    monkeypatch.setattr(chat, "render", render)
    path = tmp_path / "two.jsonl"
    path.write_text(json.dumps({"kind": "k", "messages": [{"role": "user", "content": "a"},
                                                          {"role": "assistant", "content": "b"},
                                                          {"role": "user", "content": "c"},
                                                          {"role": "assistant", "content": "d"}]}) + "\n")
    conversations = read_conversations(path)
    turns = scored_turns(conversations, tokenizer, path)
    assert [(t.prompt, t.reply, t.cached) for t in turns] == [((1, 2, 6), (4, 5), 0),
                                                             ((1, 2, 6, 9, 1, 2, 6), (4, 5), 3)]
    census = kind_census("k", conversations, turns)  # held [1, 2, 6, 4, 5]: [9, 1, 2, 6] is new, not [2, 6]
    assert (census["prompt_ids"], census["context_ids"]) == (3 + 4, 3)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_an_oracle_takes_one_pass_for_the_first_id_and_one_per_k_plus_one_after(turns, tokenizer, k):
    answers = {t.prompt: t.reply for t in turns}
    total, by_kind = acceptance(turns, lambda: Oracle(answers, vocab=tokenizer.vocab_size), str(k),
                                tokenizer.vocab_size)
    passes = [1 + math.ceil((len(t.reply) - 1) / (k + 1)) for t in turns]
    # after the first id: full passes of k drafted + 1 of the model's, then the last few ids all drafted
    accepted = [(len(t.reply) - 1) // (k + 1) * k + (len(t.reply) - 1) % (k + 1) for t in turns]
    ids = sum(len(t.reply) for t in turns)
    assert total.passes == sum(passes)
    assert total.summary()["tokens_per_pass"] == ids / sum(passes)
    assert total.proposed == total.accepted == sum(accepted)  # every drafted id is right
    assert by_kind["rewrite"].passes == passes[0] and by_kind["tool_loop"].passes == passes[1] + passes[2]


def test_an_oracle_with_auto_soon_drafts_as_many_as_k_8(turns, tokenizer):
    """auto weighs drafts by the demo model's pass bytes (a second row costs 2 % more): from the prior's few ids
    it reaches 8 after a pass or two of right drafts, so it takes at most two passes more than K = 8."""
    answers = {t.prompt: t.reply for t in turns}
    cost = pass_cost(DEMO)
    runs = {k: acceptance(turns[:1], lambda: Oracle(answers, vocab=tokenizer.vocab_size), k, tokenizer.vocab_size,
                          cost)[0].passes for k in ("8", "auto")}
    assert runs["8"] < runs["auto"] <= runs["8"] + 2


@pytest.mark.parametrize("k", ["1", "2", "4", "8", "auto"])
def test_an_always_wrong_source_gives_exactly_one_id_per_pass(turns, tokenizer, k):
    answers = {t.prompt: t.reply for t in turns}
    total, _ = acceptance(turns, lambda: Oracle(answers, 1, tokenizer.vocab_size), k, tokenizer.vocab_size,
                          pass_cost(DEMO))
    assert total.summary()["tokens_per_pass"] == 1.0 and total.accepted == 0 < total.proposed


def test_ngram_gains_on_the_rewrite_and_json_has_the_documented_shape(transcripts, capsys):
    assert main(["bench", "drafts", str(DEMO), "--transcripts", str(transcripts), "--sources", "ngram", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    ngram = doc["sources"]["ngram"]
    assert set(ngram["tokens_per_pass"]) == {"1", "2", "4", "8", "auto"}
    assert set(ngram["by_kind"]) == {"rewrite", "tool_loop", "unlabelled"}
    assert all({"8", "auto"} <= set(v) for v in ngram["by_kind"].values())
    assert ngram["by_kind"]["rewrite"]["8"] > 1 and ngram["by_kind"]["rewrite"]["auto"] > 1
    assert all(v >= 1 for v in ngram["tokens_per_pass"].values())
    loop = doc["kinds"]["tool_loop"]
    assert doc["turns"] == 4 and set(loop) == {"conversations", "turns", "reply_ids", "prompt_ids", "context_ids"}
    assert (loop["conversations"], loop["turns"]) == (1, 2) and loop["prompt_ids"] > 0 < loop["context_ids"]
    runs = ngram["counts"]["auto"]["all"]
    assert runs["ids"] == doc["reply_ids"] and 0 < runs["accepted"] <= runs["proposed"]


def test_the_table_shows_every_kind(transcripts, capsys):
    assert main(["bench", "drafts", "--transcripts", str(transcripts), "--sources", "ngram"]) == 0
    out = capsys.readouterr().out
    assert "| ngram | rewrite | 1 |" in out and "| ngram | all kinds | 4 |" in out and "tokens per pass" in out


BAD_LINES = [
    ('{"messages": [{"role": "robot", "content": "x"}]}', "messages[0].role"),
    ('{"messages": []}', "messages"),
    ('{"kind": 3, "messages": [{"role": "user", "content": "x"}]}', "kind"),
    ('{"messages": [{"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f", "arguments": '
     '"not json"}}]}]}', "messages[0].tool_calls[0].function.arguments"),
    ('{"messages": [{"role": "user", "content": 7}]}', "messages[0].content"),
    ('{"messages": [', "the line"),
    ("[1, 2]", "the line"),
]


@pytest.mark.parametrize("line, field", BAD_LINES)
def test_a_bad_line_is_exit_2_naming_the_line_and_the_field(tmp_path, capsys, line, field):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(CONVERSATIONS[0]) + "\n" + line + "\n", encoding="utf-8")
    assert main(["bench", "drafts", "--transcripts", str(path), "--sources", "ngram"]) == 2
    assert f"{path} line 2: {field}:" in capsys.readouterr().err


def test_unknown_sources_and_misplaced_flags_are_exit_2(transcripts, capsys):
    assert main(["bench", "drafts", "--transcripts", str(transcripts), "--sources", "ngram,no-such-source"]) == 2
    assert "no-such-source" in capsys.readouterr().err
    assert main(["bench", "drafts", "--sources", "ngram"]) == 2
    assert "--sources needs --transcripts" in capsys.readouterr().err
    assert main(["bench", "drafts", "--transcripts", str(transcripts.with_name("missing.jsonl"))]) == 2
    assert "cannot read it" in capsys.readouterr().err
