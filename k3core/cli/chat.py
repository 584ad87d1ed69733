"""`k3 chat`: a terminal conversation that streams tokens. Follow-up turns forward only their new
tokens (the decode state is kept); /save and /load keep a conversation across runs; Ctrl-C stops a
reply at the next token without ending the session; Ctrl-D or /quit leaves.
"""
from __future__ import annotations

import argparse
import signal
import sys
import time

from .options import (EXIT_CODES, add_engine_arguments, add_sampling_arguments, add_speculation_arguments, engine_config_from_args, open_engine,
                     sampling_params_from_args, speculation_from_args)
from ..api import K3Error
from ..text.channels import visible

HELP = """commands:
  /reset         start a new conversation (forget the decode state)
  /save FILE     save the conversation and its decode state
  /load FILE     continue a saved conversation (same model only)
  /mode instruct|thinking
  /stats         tokens reused, forwarded and generated in the last turn; speed; memory
  /help          this text
  /quit          leave (Ctrl-D too); Ctrl-C stops a reply, not the chat"""


class Interrupt:
    """Ctrl-C while a reply streams sets a flag the generation checks between tokens."""

    def __init__(self):
        self.hit = False

    def __enter__(self):
        self.hit = False
        self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, *_):
        self.hit = True

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self._old)


def _show(event, tty: bool, state: dict) -> None:
    if event.channel != state.get("channel"):
        state["channel"] = event.channel
        if event.channel == "think":
            print("[thinking] " if not tty else "\x1b[2m", end="")
        elif tty:
            print("\x1b[0m", end="")
        elif state.get("seen_think"):
            print("\n[answer] ", end="")
        state["seen_think"] = state.get("seen_think") or event.channel == "think"
    print(visible(event.text) if tty else event.text, end="", flush=True)


def _stats(chat, engine) -> str:
    from ..report.run import peak_rss_bytes

    last = chat.last
    if not last:
        return "no turn yet"
    spt = last.get("seconds_per_token")
    return (f"last turn: prompt {last['prompt_tokens']} tokens, {last['reused_tokens']} reused from the decode state, "
            f"{last['forwarded_tokens']} forwarded, {last['generated_tokens']} generated ({last['reason']}); "
            f"first token {last['prefill_seconds']:.2f} s, {spt:.3f} s/token" if spt else
            f"last turn: prompt {last['prompt_tokens']} tokens, {last['reused_tokens']} reused, "
            f"{last['forwarded_tokens']} forwarded, {last['generated_tokens']} generated ({last['reason']})") + \
        f"\nsession: {engine.tokens_forwarded} tokens forwarded in all; peak RSS {peak_rss_bytes() / 2**20:.0f} MiB"


def _command(line: str, chat, engine) -> bool:
    """Run a /command; False means leave."""
    from ..api import load_state, save_state

    name, _, arg = line.strip().partition(" ")
    arg = arg.strip()
    if name in ("/quit", "/exit"):
        return False
    if name == "/help":
        print(HELP)
    elif name == "/reset":
        chat.reset()
        print("(new conversation)")
    elif name == "/stats":
        print(_stats(chat, engine))
    elif name == "/mode" and arg:
        chat.set_mode(arg)
        print(f"(mode {arg})")
    elif name == "/save" and arg:
        save_state(arg, engine, chat.session.state, extra={"conversation": chat.snapshot()}, what="/save")
        print(f"(saved {len(chat.history)} tokens of conversation to {arg})")
    elif name == "/load" and arg:
        state, extra = load_state(arg, engine)  # the whole file is checked before the conversation is touched
        chat.check_snapshot(extra.get("conversation"), f"{arg}: its conversation")
        chat.restore(extra["conversation"], state)
        print(f"(loaded {arg}: {len(chat.conv.messages)} messages, {len(state.ids)} tokens of decode state)")
    else:
        print(f"unknown command {line.strip()!r}\n{HELP}")
    return True


HISTORY_LINES = 1000


class LineEditing:
    """On a terminal: readline's line editing, and the last HISTORY_LINES inputs kept in
    chat_history beside the saved profile (owner-readable only), across sessions."""

    def __init__(self):
        from ..io.profile import profile_path

        self.path = profile_path().parent / "chat_history"
        try:
            import readline
        except ImportError:  # a Python built without it: plain input()
            self.readline = None
            return
        self.readline = readline
        readline.set_history_length(HISTORY_LINES)
        try:
            readline.read_history_file(self.path)
        except OSError:
            pass

    def save(self) -> None:
        if self.readline is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.readline.write_history_file(self.path)
            self.path.chmod(0o600)
        except OSError as exc:
            print(f"k3 chat: history not saved to {self.path}: {exc.strerror}", file=sys.stderr)


def cmd_chat(args) -> int:
    params = sampling_params_from_args(args)
    config = engine_config_from_args(args)
    tty = sys.stdout.isatty()
    editing = LineEditing() if sys.stdin.isatty() else None
    try:
        return _converse(args, config, params, tty)
    finally:
        if editing is not None:
            editing.save()


def _converse(args, config, params, tty) -> int:
    from ..api import ChatSession, load_tokenizer

    with open_engine(config) as engine:
        chat = ChatSession(engine, load_tokenizer(config.tokenizer or config.model),
                           "thinking" if args.thinking else "instruct", args.system)
        print(f"k3 chat: {config.model} ({chat.mode} mode). /help for commands, ↑/↓ for history, Ctrl-D to leave.")
        while True:
            try:
                line = input("> ")
            except EOFError:
                print()
                return 0
            except KeyboardInterrupt:
                print()
                continue
            if not line.strip():
                continue
            if line.startswith("/"):
                try:
                    if not _command(line, chat, engine):
                        return 0
                except (K3Error, KeyError, OSError) as exc:
                    print(f"k3: {exc}", file=sys.stderr)
                continue
            shown: dict = {}
            started = time.perf_counter()
            with Interrupt() as interrupt:
                for event in chat.ask(line, params, cancelled=lambda: interrupt.hit, speculation=speculation_from_args(args)):
                    if event.kind == "text":
                        _show(event, tty, shown)
            print("\x1b[0m" if tty else "")
            if chat.last.get("reason") == "cancelled":
                print("(stopped)")
            if args.verbose:
                print(f"({time.perf_counter() - started:.2f} s) " + _stats(chat, engine), file=sys.stderr)


def add_parser(sub) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser(
        "chat", formatter_class=fmt, help="talk to the model in the terminal",
        description="A conversation in the K3 chat format, streamed token by token. Each follow-up turn\n"
                    "forwards only its new tokens: the decode state (KDA states, MLA cache) is kept.\n\n"
                    + HELP,
        epilog="examples:\n"
               "  k3 chat demo-model\n"
               "  k3 chat demo-model --thinking --temperature 1.0 --seed 1\n"
               "  k3 chat /models/Kimi-K3 --trunk /nvme/k3-trunk --preset auto --system 'Be brief.'\n\n"
               + EXIT_CODES)
    add_engine_arguments(p)
    g = p.add_argument_group("chat")
    g.add_argument("--tok", metavar="DIR", help="tokenizer directory (default: MODEL_DIR)")
    g.add_argument("--thinking", action="store_true", help="thinking mode (shown dimmed before the answer)")
    g.add_argument("--system", metavar="TEXT", help="a system message")
    g.add_argument("--verbose", action="store_true", help="print /stats after every reply")
    add_sampling_arguments(p, default_max=512)
    add_speculation_arguments(p)
    p.set_defaults(func=cmd_chat)
