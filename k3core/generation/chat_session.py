"""A conversation on an engine: each turn streams its reply, and the next turn forwards only its
own new tokens. The session keeps the exact ids the model has seen (prompts, generated replies,
and the markup that closes a reply cut short), so a new turn always strictly extends the decode
state (MODEL.md §4.5) even when a reply would re-render differently from how it was generated.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, NoReturn, Sequence

from ..model.state_file import StateFileError
from ..text.chat import CLOSE, EOM, FIELDS, MODES, SEP, Conversation, render
from ..errors import UsageError
from .sampling import SamplingParams
from .channels import Event
from .session import Session

if TYPE_CHECKING:
    from ..model.engine import DecodeState, Engine
    from ..model.observer import Observer
    from .generate import Speculation
    from .prefix_cache import PrefixCache
    from ..text.tokenizer import Tokenizer


class ChatSession:
    def __init__(self, engine: Engine, tokenizer: Tokenizer, mode: str = "instruct", system: str | None = None,
                 prompt_cache: PrefixCache | None = None) -> None:
        """`prompt_cache`: kept prompt states shared with other conversations (and, with a disk tier, processes):
        a first turn resumes from the longest prefix kept there."""
        self.engine, self.tokenizer = engine, tokenizer
        self.system = system
        self.conv = Conversation(tokenizer, mode, system)
        self.session = Session(engine, tokenizer, prompt_cache)
        self.history: list[int] = []  # every id the model has seen or produced, in order
        self.last: dict = {}          # the last turn's stats

    @property
    def mode(self) -> str:
        return self.conv.mode

    def set_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise UsageError(f"chat mode must be 'instruct' or 'thinking', got {mode!r}")
        self.conv.mode = mode

    def reset(self) -> None:
        self.conv = Conversation(self.tokenizer, self.mode, self.system)
        self.session.reset()
        self.history, self.last = [], {}

    def _prompt(self) -> list[int]:
        """This turn's prompt: the exact history, then the rendering of what is new since."""
        full = self.conv.prompt()
        if not self.history:
            return full
        before = render(self.conv.messages[:-1], self.tokenizer, self.mode, add_generation_prompt=False,
                        own_replies=True)
        if full[:len(before)] != before:  # a template whose past turns depend on the present one
            return full
        return self.history + full[len(before):]

    def ask(self, text: str, params: SamplingParams, cancelled: Callable[[], bool] = lambda: False,
            observers: Sequence[Observer] = (), speculation: Speculation | None = None) -> Iterator[Event]:
        """Add the user's message and stream the reply (text events, then "done"); `observers` watch
        the forward passes (k3core.Observer); `speculation` (a k3core.Speculation) drafts and verifies."""
        self.conv.add_user(text)
        prompt = self._prompt()
        channel = MODES[self.mode]
        for event in self.session.generate(prompt, params, stop_ids=sorted(self.conv.stop_ids), channel=channel,
                                           cancelled=cancelled, observers=observers, speculation=speculation):
            if event.kind == "done":
                reply = self.conv.add_reply(event.ids)
                self.history = prompt + event.ids + self._closing(event.stats["open_channel"], reply.finished)
                self.last = {**event.stats, "reason": event.reason, "thinking": reply.thinking,
                             "answer": reply.content}
            yield event

    def _closing(self, channel: str | None, finished: bool) -> list[int]:
        """Markup that ends a reply cut short (max tokens, a stop string, Ctrl-C)."""
        if finished:
            return []
        tok = self.tokenizer
        closing = [tok.id_of(CLOSE)] + tok.encode(channel) + [tok.id_of(SEP)] if channel else []
        return closing + [tok.id_of(EOM)]

    def snapshot(self) -> dict:
        return {"mode": self.mode, "system": self.system, "messages": self.conv.messages, "history": self.history}

    def check_snapshot(self, snap: Any, where: str = "the conversation") -> None:
        """Refuse (StateFileError, naming the key) a snapshot restore() could not continue from."""
        vocab = self.engine.config.vocab_size

        def bad(what: str) -> NoReturn:
            raise StateFileError(f"{where}: {what}")

        if not isinstance(snap, dict):
            bad("not an object")
        if snap.get("mode") not in MODES:
            bad(f"'mode' must be one of {', '.join(MODES)}, got {snap.get('mode')!r}")
        if snap.get("system") is not None and not isinstance(snap.get("system"), str):
            bad("'system' must be text or null")
        messages = snap.get("messages")
        if not isinstance(messages, list):
            bad("'messages' is missing or not a list")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in FIELDS:
                bad(f"'messages'[{i}] has no role of {', '.join(FIELDS)}")
            wrong = [k for k, v in m.items() if k != "role" and (k not in FIELDS[m["role"]] or not
                                                                  (v is None or isinstance(v, str)))]
            if wrong or not isinstance(m.get("content", ""), str):
                bad(f"'messages'[{i}] ({m['role']}) has a bad field {wrong[0] if wrong else 'content'!r}")
        history = snap.get("history")
        if not isinstance(history, list) or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < vocab
                                                    for x in history):
            bad(f"'history' must be a list of token ids in 0..{vocab - 1}")

    def restore(self, snap: dict, state: DecodeState) -> None:
        self.check_snapshot(snap)
        self.system = snap.get("system")
        self.conv = Conversation(self.tokenizer, snap["mode"], None)
        self.conv.messages = list(snap["messages"])
        self.history = [int(t) for t in snap["history"]]
        self.session.state = state
        self.last = {}  # the last turn's stats were another conversation's

