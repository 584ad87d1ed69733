"""`k3 chat`: a terminal conversation that streams tokens. Follow-up turns forward only their new
tokens (the decode state is kept); /save and /load keep a conversation across runs; Ctrl-C stops a
reply at the next token without ending the session; Ctrl-D or /quit leaves.
"""
from __future__ import annotations

import argparse
import signal
import sys
import time

from .options import (EXIT_CODES, add_engine_arguments, add_prompt_cache_arguments, add_sampling_arguments,
                      add_speculation_arguments, engine_config_from_args, open_engine, prompt_cache_from_args,
                      sampling_params_from_args, speculation_from_args)
from ..errors import K3Error, UsageError
from ..model.state_file import StateFileError
from ..text.chat import MODES
from ..units import human
from ..generation.channels import visible

# each command: its synopsis (what /help and a bad use print) and what it does
COMMANDS = {
    "/reset": ("/reset", "start a new conversation (forget the decode state)"),
    "/save": ("/save FILE", "save the conversation and its decode state"),
    "/load": ("/load FILE", "continue a saved conversation (same model only)"),
    "/mode": ("/mode instruct|thinking", "answer at once, or think first (under 'thinking:', then 'answer:')"),
    "/stats": ("/stats", "the last turn's tokens (prompt, reused, forwarded, generated), speed; memory"),
    "/help": ("/help", "this text"),
    "/quit": ("/quit", "leave (Ctrl-D too); Ctrl-C stops a reply, not the chat"),
}
HELP = "commands:\n" + "\n".join(f"  {synopsis:<14} {what}" if len(synopsis) < 15 else
                                  f"  {synopsis}\n  {'':<14} {what}" for synopsis, what in COMMANDS.values())
LABELS = {"think": "thinking:", "response": "answer:", "tools": "tool call:"}  # a reply that thinks, read apart


def usage(name: str, why: str) -> UsageError:
    """A bad use of a command: its synopsis and what was wrong (printed as `k3: usage: ...`)."""
    return UsageError(f"usage: {COMMANDS[name][0]} — {why}")


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
    """Print a reply's text as it streams. A reply that thinks reads apart without colour: a 'thinking:' line
    over the reasoning, a blank line, an 'answer:' line over the answer (on a terminal the reasoning is also
    dimmed)."""
    if event.channel != state.get("channel"):
        state["channel"] = event.channel
        state["thought"] = state.get("thought") or event.channel == "think"
        if state["thought"]:
            ends = state.get("ends")  # newlines the printed text ends with (None: nothing printed yet)
            between = "" if ends is None else "\x1b[0m" * tty + "\n" * max(0, 2 - ends)  # a blank line
            print(between + LABELS.get(event.channel, f"{event.channel}:"),
                  end="\n\x1b[2m" if tty and event.channel == "think" else "\n")
            state["ends"], state["fresh"] = 1, True
    text = visible(event.text) if tty else event.text
    if state.get("fresh"):  # the first text under a label starts on the label's next line, not below a gap
        text = text.lstrip("\n")
        state["fresh"] = not text
    if text:
        stripped = text.rstrip("\n")
        state["ends"] = len(text) - len(stripped) if stripped else (state.get("ends") or 0) + len(text)
    print(text, end="", flush=True)


def _stats(chat, engine) -> str:
    """/stats: the last turn's token counts, printed so they add up, its speed; the session's memory."""
    from ..report.run import peak_rss_bytes, prompt_cache_text

    session = f"session: {engine.tokens_forwarded} tokens forwarded in all; peak RSS {human(peak_rss_bytes())}"
    if (cache := chat.session.prompt_cache) is not None:
        session += f"\nprompt cache: {prompt_cache_text(cache.stats())}"
    last = chat.last
    if not last and chat.history:
        return (f"no turn since /load yet: the next one reuses the {len(chat.session.state.ids)} tokens of decode "
                f"state loaded\n{session}")
    if not last:
        return f"no turn yet\n{session}"
    prompt, reused, forwarded, generated = (last[k] for k in ("prompt_tokens", "reused_tokens", "forwarded_tokens",
                                                              "generated_tokens"))
    new = prompt - reused
    fed_back = max(generated - 1, 0)  # every generated token but the last is forwarded (the last, next turn)
    extra = forwarded - new - fed_back
    if extra < 0:  # stopped while the prompt was being forwarded
        how = f"{forwarded} of the {new} new (stopped before the prompt was all forwarded)"
    else:
        how = f"{new} new + {fed_back} generated (each generated token but the last)"
        if extra:
            how += f" + {extra} drafted, not kept" if last.get("draft_proposed") else f" + {extra} other"
    spt = last.get("seconds_per_token")
    speed = f"; first token after {last['prefill_seconds']:.2f} s" + (f", then {spt:.3f} s/token" if spt else "")
    return (f"last turn ({last['reason']}):\n"
            f"  prompt     {prompt} tokens = {reused} reused (the decode state or the prompt cache) + {new} new\n"
            f"  forwarded  {forwarded} tokens = {how}\n"
            f"  generated  {generated} tokens{speed if generated else ''}\n{session}")


def _command(line: str, chat, engine) -> bool:
    """Run a /command; False means leave. A bad use raises UsageError with the command's usage."""
    from ..api import load_state, save_state

    name, _, arg = line.strip().partition(" ")
    arg = arg.strip()
    if name == "/exit":
        name = "/quit"
    if name in ("/reset", "/stats", "/quit") and arg:
        raise usage(name, f"it takes no argument, got {arg!r}")
    if name in ("/save", "/load") and not arg:
        raise usage(name, "the file to save to" if name == "/save" else "a file /save wrote")
    if name == "/quit":
        return False
    if name == "/help":
        print(HELP)
    elif name == "/reset":
        chat.reset()
        print("(new conversation)")
    elif name == "/stats":
        print(_stats(chat, engine))
    elif name == "/mode":
        if arg not in MODES:
            raise usage(name, f"{arg!r} is not a mode" if arg else f"the mode now is {chat.mode}")
        chat.set_mode(arg)
        print(f"(mode {arg})")
    elif name == "/save":
        save_state(arg, engine, chat.session.state, extra={"conversation": chat.snapshot()}, what="/save")
        print(f"(saved {len(chat.history)} tokens of conversation to {arg})")
    elif name == "/load":
        try:  # the whole file is checked before the conversation is touched
            state, extra = load_state(arg, engine)
        except StateFileError as exc:  # names a missing file, a directory, an unreadable one or a bad one
            raise StateFileError(f"/load {exc}") from None
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
        from ..plan.profile import profile_path

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
        tokenizer = load_tokenizer(config.tokenizer or config.model)
        chat = ChatSession(engine, tokenizer, "thinking" if args.thinking else "instruct", args.system,
                           prompt_cache_from_args(args, engine, tokenizer))
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
    g.add_argument("--thinking", action="store_true",
                   help="thinking mode (the reasoning under a 'thinking:' line, then the reply under 'answer:')")
    g.add_argument("--system", metavar="TEXT", help="a system message")
    g.add_argument("--verbose", action="store_true", help="print /stats after every reply")
    add_sampling_arguments(p, default_max=512)
    add_speculation_arguments(p)
    add_prompt_cache_arguments(p)
    p.set_defaults(func=cmd_chat)
