"""`k3 chat` driven through a pseudo-terminal, as a person would: two turns where the second
forwards only its new tokens; /save + /load continue identically; another model's state file is
refused; Ctrl-C stops a reply and the chat goes on."""
import os
import pty
import re
import select
import sys
import time

import pytest


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
    m = re.search(rb"prompt (\d+) tokens, (\d+) reused from the decode state, (\d+) forwarded, (\d+) generated", text)
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
