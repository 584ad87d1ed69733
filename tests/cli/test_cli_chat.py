"""`k3 chat` driven through a pseudo-terminal, as a person would: two turns where the second
forwards only its new tokens; /save + /load continue identically; another model's state file is
refused; Ctrl-C stops a reply and the chat goes on. And what a person reads, exactly, on the trained demo
model: a thinking reply labelled apart from its answer (terminal and pipe alike), /stats whose numbers add
up as printed, in decimal units, and each bad use of a command answered with its usage."""
import os
import pty
import re
import select
import subprocess
import sys
import time

import pytest

from ..conftest import DEMO_MODEL


class Terminal:
    def __init__(self, *args):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: k3 chat on the pseudo-terminal
            os.execv(sys.executable, [sys.executable, "-m", "k3core", "chat", *map(str, args)])
        self.out = b""

    def read_until(self, pattern: bytes, timeout=60.0, since: int = 0) -> bytes:
        end = time.time() + timeout
        while not re.search(pattern, self.out[since:], re.S):
            if time.time() > end:
                raise AssertionError(f"timed out waiting for {pattern!r}; got {self.out[-2000:]!r}")
            ready, _, _ = select.select([self.fd], [], [], 0.5)
            if ready:
                try:
                    self.out += os.read(self.fd, 65536)
                except OSError:
                    break
        return self.out

    def turn(self, line: str) -> bytes:
        """Send a line, return what came back up to the next prompt."""
        start = len(self.out)
        os.write(self.fd, line.encode() + b"\r")
        self.read_until(rb"\n> $", timeout=60, since=start)
        return self.out[start:]

    def close(self):
        os.write(self.fd, b"/quit\r")
        _, status = os.waitpid(self.pid, 0)
        os.close(self.fd)
        return os.waitstatus_to_exitcode(status)


def stats(text: bytes) -> dict:
    m = re.search(rb"prompt +(\d+) tokens = (\d+) reused \(the decode state or the prompt cache\) \+ \d+ new\r\n"
                  rb"  forwarded +(\d+) tokens = .*?\r\n  generated +(\d+) tokens", text)
    return dict(zip(("prompt", "reused", "forwarded", "generated"), map(int, m.groups())))


def reply_of(text: bytes) -> bytes:
    return text.split(b"\r\n", 1)[1].rsplit(b"\r\n> ", 1)[0]


@pytest.fixture
def chat(small_model):
    terms = []

    def start(*extra):
        t = Terminal(small_model, "--max-tokens", "6", *extra)
        t.read_until(rb"\n> $")
        terms.append(t)
        return t

    yield start
    for t in terms:
        try:
            t.close()
        except OSError:
            pass


def test_the_second_turn_forwards_only_its_new_tokens(chat):
    t = chat()
    t.turn("hello there")
    first = stats(t.turn("/stats"))
    t.turn("and a second question")
    second = stats(t.turn("/stats"))
    assert first["reused"] == 0 and first["forwarded"] == first["prompt"] + first["generated"] - 1
    assert second["reused"] == first["prompt"] + first["generated"] - 1
    assert second["forwarded"] == second["prompt"] - second["reused"] + second["generated"] - 1
    assert second["forwarded"] < second["prompt"]


def test_save_and_load_continue_identically(chat, tmp_path):
    t = chat()
    t.turn("hello there")
    t.turn(f"/save {tmp_path / 's.npz'}")
    straight = reply_of(t.turn("what next?"))
    u = chat()
    assert b"loaded" in u.turn(f"/load {tmp_path / 's.npz'}")
    assert reply_of(u.turn("what next?")) == straight
    assert stats(u.turn("/stats"))["reused"] > 0


def test_a_state_from_another_model_is_refused_and_the_chat_goes_on(chat, tiny_model, tmp_path):
    from k3core import EngineConfig, open_engine
    from k3core.model.state_file import save_state
    with open_engine(EngineConfig(tiny_model)) as engine:
        state = engine.new_state()
        engine.forward([1, 2, 3], state)
        save_state(tmp_path / "other.npz", engine, state, extra={"conversation": {}})
    t = chat()
    assert b"another model" in t.turn(f"/load {tmp_path / 'other.npz'}")
    assert b"generated" in t.turn("hi") + t.turn("/stats")


def test_ctrl_c_stops_a_reply_and_the_chat_goes_on(small_model):
    # seed 1: no <|end_of_msg|> in the first 1,500 ids of this reply, so only Ctrl-C can end it early
    t = Terminal(small_model, "--max-tokens", "1000000", "--temperature", "1.0", "--seed", "1")
    try:
        t.read_until(rb"\n> $")
        start = len(t.out)
        os.write(t.fd, b"tell me everything\r")
        t.read_until(rb"tell me everything\r\n.{20}", timeout=60, since=start)  # the reply is streaming
        os.write(t.fd, b"\x03")
        t.read_until(rb"\(stopped\)\r\n> $", timeout=60, since=start)
        assert b"Traceback" not in t.out[start:]
        assert b"cancelled" in t.turn("/stats")
        assert b"(new conversation)" in t.turn("/reset")
        t.turn("short one")
        assert b"generated" in t.turn("/stats")
    finally:
        assert t.close() == 0


# --- what a person reads, exactly: the trained demo model, its answers known ---

SIX_AND_SEVEN = "thinking:\nI work out 6 + 7: the result is 13.\n\nanswer:\n6 + 7 = 13.\n"
RSS = r"peak RSS \d+(\.\d+)? [kMG]B"  # k3core.units.human, decimal, as the page says it
CACHE = r"prompt cache: \d+ checkpoints, \d+(\.\d+)? [kMG]?B in RAM, 0 B on disk; \d+ hits, \d+ misses, \d+ ids reused"


def piped(*lines, flags=("--thinking",), cache=("--prompt-cache", "off")) -> list[str]:
    """k3 chat on the demo model, its input and output pipes (stderr merged in order): what came back after
    each line, as the user sees it. `cache`: the prompt-cache flags (default: none on disk, so no other test's
    prompts are found there)."""
    run = subprocess.run([sys.executable, "-m", "k3core", "chat", str(DEMO_MODEL), "--max-tokens", "80", *flags,
                          *cache],
                         input="".join(f"{line}\n" for line in lines), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert run.returncode == 0, run.stdout
    after = run.stdout.split("Ctrl-D to leave.\n", 1)[1]
    answers = re.split(r"(?m)^> ", after)[1:]
    assert answers.pop() == "\n" and len(answers) == len(lines), after  # Ctrl-D (the pipe's end) leaves
    return answers


def test_a_thinking_reply_on_a_pipe_is_labelled_apart_from_its_answer():
    assert piped("what is 6 + 7?") == [SIX_AND_SEVEN]


def test_a_thinking_reply_on_a_terminal_reads_apart_without_its_colour():
    t = Terminal(DEMO_MODEL, "--thinking", "--max-tokens", "80")
    try:
        t.read_until(rb"\n> $")
        shown = reply_of(t.turn("what is 6 + 7?"))
        assert shown == (b"thinking:\r\n\x1b[2mI work out 6 + 7: the result is 13.\x1b[0m\r\n\r\n"
                         b"answer:\r\n6 + 7 = 13.\x1b[0m")
        assert re.sub(rb"\x1b\[\d+m", b"", shown).replace(b"\r\n", b"\n") + b"\n" == SIX_AND_SEVEN.encode()
    finally:
        assert t.close() == 0


def test_an_instruct_reply_has_no_labels():
    assert piped("hello", flags=()) == ["Hello! How can I help?\n"]


def test_stats_add_up_as_printed_in_decimal_units():
    first, stats_1, second, stats_2 = piped("what is 6 + 7?", "/stats", "and 3 + 4?", "/stats")
    assert (first, second) == (SIX_AND_SEVEN, SIX_AND_SEVEN.replace("6 + 7", "3 + 4").replace("13", "7"))
    forwarded = "  forwarded  50 tokens = 18 new + 32 generated (each generated token but the last)"
    for shown, lines in ((stats_1, ["last turn (stop id):",
                                    "  prompt     18 tokens = 0 reused (the decode state or the prompt cache) + 18 new",
                                    forwarded]),
                         (stats_2, ["last turn (stop id):",
                                    "  prompt     68 tokens = 50 reused (the decode state or the prompt cache) + 18 new",
                                    forwarded])):
        assert shown.splitlines()[:3] == lines
        assert re.fullmatch(r"  generated  33 tokens; first token after \d+\.\d\d s, then \d+\.\d{3} s/token",
                            shown.splitlines()[3])
    assert re.fullmatch(rf"session: 50 tokens forwarded in all; {RSS}\n{CACHE}\n", stats_1.split("\n", 4)[4])
    assert re.fullmatch(rf"session: 100 tokens forwarded in all; {RSS}\n{CACHE}\n", stats_2.split("\n", 4)[4])
    for shown in (stats_1, stats_2):  # the arithmetic printed is the arithmetic that holds
        n = [int(x) for x in re.findall(r"\d+", "".join(shown.splitlines()[1:3]))]
        prompt, reused, new, forwarded, new_again, fed_back = n
        assert prompt == reused + new and forwarded == new_again + fed_back and new == new_again


def test_stats_with_speculation_name_the_drafts_not_kept():
    shown = piped("what is 6 + 7?", "/stats", flags=("--thinking", "--speculate", "4"))[1].splitlines()
    m = re.fullmatch(r"  forwarded  (\d+) tokens = 18 new \+ 32 generated \(each generated token but the last\) "
                     r"\+ (\d+) drafted, not kept", shown[2])
    assert m and int(m[1]) == 18 + 32 + int(m[2]) and int(m[2]) > 0, shown


def test_stats_after_load_are_the_loaded_conversations(tmp_path):
    state = tmp_path / "s.npz"
    answers = piped("what is 6 + 7?", "/stats", f"/save {state}", f"/load {state}", "/stats")
    assert answers[1].startswith("last turn (stop id):\n")  # the turn before, until the /load
    assert answers[2:4] == [f"(saved 51 tokens of conversation to {state})\n",
                            f"(loaded {state}: 2 messages, 50 tokens of decode state)\n"]
    assert re.fullmatch(rf"no turn since /load yet: the next one reuses the 50 tokens of decode state loaded\n"
                        rf"session: 50 tokens forwarded in all; {RSS}\n{CACHE}\n", answers[4])


def test_stats_before_any_turn():
    assert re.fullmatch(rf"no turn yet\nsession: 0 tokens forwarded in all; {RSS}\n{CACHE}\n", piped("/stats")[0])


def test_a_second_chat_process_resumes_from_the_prompt_cache_on_disk(tmp_path):
    """Two `k3 chat` processes, one after the other, with the same system prompt: the second one's first turn
    forwards only its own question (its stats say what the cache gave), and its reply is the first one's."""
    flags, cache = ("--system", "You are brief."), ("--prompt-cache", str(tmp_path))
    first = piped("what is 6 + 7?", "/stats", flags=flags, cache=cache)
    second = piped("what is 6 + 7?", "/stats", flags=flags, cache=cache)
    assert first[0] == second[0] == "6 + 7 = 13.\n"
    reused = [int(re.search(r"= (\d+) reused", s[1])[1]) for s in (first, second)]
    prompt = int(re.search(r"prompt +(\d+) tokens", second[1])[1])
    assert reused == [0, prompt - 1]  # the same prompt: all but its last id
    assert re.search(r"prompt cache: \d+ checkpoints, .* on disk", second[1])


@pytest.mark.parametrize("line, says", [
    ("/save", "k3: usage: /save FILE — the file to save to"),
    ("/load", "k3: usage: /load FILE — a file /save wrote"),
    ("/load {tmp}/missing.npz", "k3: /load {tmp}/missing.npz: the file does not exist"),
    ("/load {tmp}", "k3: /load {tmp}: is a directory"),
    ("/load {tmp}/file/s.npz", "k3: /load {tmp}/file/s.npz: cannot read: Not a directory"),
    ("/mode", "k3: usage: /mode instruct|thinking — the mode now is thinking"),
    ("/mode foo", "k3: usage: /mode instruct|thinking — 'foo' is not a mode"),
    ("/mode thinking please", "k3: usage: /mode instruct|thinking — 'thinking please' is not a mode"),
    ("/reset now", "k3: usage: /reset — it takes no argument, got 'now'"),
    ("/stats now", "k3: usage: /stats — it takes no argument, got 'now'"),
    ("/quit now", "k3: usage: /quit — it takes no argument, got 'now'"),
    ("/exit now", "k3: usage: /quit — it takes no argument, got 'now'"),
], ids=lambda v: v if v.startswith("/") else None)
def test_each_bad_use_of_a_command_says_its_usage(line, says, tmp_path):
    (tmp_path / "file").write_text("not a directory")
    fill = {"tmp": tmp_path}
    assert piped(line.format(**fill)) == [says.format(**fill) + "\n"]  # and the chat goes on
