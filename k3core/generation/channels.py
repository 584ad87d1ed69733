"""Ids to text events, the upper generation layer's machinery: streaming detokenisation, the XTML
channel each piece of a chat reply belongs to (markup ids make no text), and stop strings.

`TextStream.feed(id)` returns the text events that id releases and whether a stop string completed;
`finish()` releases what is still held. Special tokens (the chat markup, [EOS], [BOS] …) never become
text. No engine here: session.py drives it from generate_ids. `visible` makes generated text safe to
show on a terminal or a page.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..text.chat import CLOSE, EOM, OPEN, SEP
from .sampling import StopMatcher


@dataclass
class Event:
    kind: str                       # "text" (channel says where), "done"
    text: str = ""
    channel: str | None = None      # "think", "response", "tools" in chat mode; None for raw text
    ids: list[int] = field(default_factory=list)  # done: every id generated
    reason: str = ""                # done: "stop id", "stop string", "max tokens", "context full", "cancelled"
    stats: dict = field(default_factory=dict)


class Channels:
    """Tracks which XTML channel generated text belongs to; markup ids produce no text."""

    def __init__(self, tokenizer, first: str | None):
        self.ids = {name: tokenizer.id_of(name) for name in (OPEN, SEP, CLOSE, EOM)} if first is not None else {}
        self.tokenizer, self.current, self._tag = tokenizer, first, None
        self.open = first is not None  # the generation prefix opened `first`

    def is_markup(self, token: int) -> bool:
        if not self.ids:
            return False
        if token == self.ids[OPEN] or token == self.ids[CLOSE]:
            self._tag = [] if token == self.ids[OPEN] else "closing"
            return True
        if token == self.ids[SEP] and self._tag is not None:
            if self._tag != "closing":
                header = self.tokenizer.decode(self._tag).split()
                self.current = header[0] if header else "response"
            self.open = self._tag != "closing"
            self._tag = None
            return True
        if self._tag is not None:
            if self._tag != "closing":
                self._tag.append(token)
            return True
        return False


class TextStream:
    """Generated ids in, text events out, for one generation."""

    def __init__(self, tokenizer, stop_strings=(), channel: str | None = None):
        self.decoder = tokenizer.stream()
        self.stops, self.channels = StopMatcher(stop_strings), Channels(tokenizer, channel)
        self.special = tokenizer.special_ids
        self.stopped = False

    def feed(self, token: int) -> list[Event]:
        """The text `token` releases (none for markup or any special token); sets `stopped` when a stop
        string completed."""
        if self.stopped or self.channels.is_markup(token) or token in self.special:
            return []
        text, self.stopped = self.stops.feed(self.decoder.push(token))
        return [Event("text", text, self.channels.current)] if text else []

    def finish(self) -> list[Event]:
        """What is still held back (a partial character, a possible stop-string start)."""
        if self.stopped:
            return []
        tail = self.stops.feed(self.decoder.flush())[0] + self.stops.flush()
        return [Event("text", tail, self.channels.current)] if tail else []

    @property
    def open_channel(self) -> str | None:
        """The channel the reply is still inside, or None once it closed it."""
        return self.channels.current if self.channels.open else None


# C0 controls but tab and newline, DEL and the C1 controls: shown as escapes, never obeyed
_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0)]}


def visible(text: str) -> str:
    """`text` with every control character a terminal or browser would act on (escape sequences,
    carriage returns, bells, backspaces) written as a visible `\\xNN` escape; tabs and newlines stay."""
    return text.translate(_CONTROLS)
