"""Browser conversations over the one engine. Each session key (a browser tab) owns a ChatSession;
a turn runs on a worker thread that holds the engine lock and checks a stop flag between tokens,
so closing the reply generator (Gradio's Stop) never leaves a half-updated decode state. At most
`keep_states` decode states stay live: the least recently used is freed and that conversation
recomputes its exact history ids on its next turn. No Gradio here: `Chats.reply` is a plain
generator (tests/ui/test_chat.py).
"""
from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

from k3core import ChatSession, K3Error, Observer

from .messages import display, partial, turn_note

POLL = 0.1  # seconds between looks at the worker's queue: how soon a closed reply notices
MAX_MESSAGE_CHARS = 32_000  # one message (or system prompt); the engine's --max-context bounds the whole turn
log = logging.getLogger("k3.ui")


def label(key: str) -> str:
    """A session as the log names it: a short hash, never the session id itself."""
    return hashlib.sha256(key.encode()).hexdigest()[:8]


@dataclass
class Update:
    messages: list[dict]     # the conversation for display: role, content, metadata (thinking)
    status: str              # "waiting" | "running" | "done" | "stopped" | "error"
    note: str = ""           # for the person: recomputed history, errors, why it ended
    stats: dict = field(default_factory=dict)  # ChatSession.last when done


class Slot:
    """One browser session: its ChatSession (None once its decode state was freed) and turn marks."""

    def __init__(self):
        self.chat: ChatSession | None = None
        self.snap: dict | None = None    # the conversation kept while its decode state is freed
        self.generation = -1             # EngineHost.generation the chat's state belongs to
        self.lock = threading.Lock()     # held by this session's running turn, undo and clear
        self.stops: set[threading.Event] = set()  # the flags of turns not yet ended
        self.marks: list[tuple[int, int]] = []    # (messages, history ids) before each turn
        self.used = time.monotonic()
        self.notice = ""                 # said once on the next turn (e.g. "state was freed")
        self.sampled = False             # whether the last turn sampled (its seed matters) or was greedy


class Touched(Observer):
    """Whether a turn's forward pass reached the engine (then its decode state may be half-advanced)."""

    def __init__(self):
        self.yes = False

    def on_layer(self, layer, layers):
        self.yes = True


class Chats:
    def __init__(self, host, monitor=None, keep_states: int = 2, max_sessions: int = 256):
        self.host, self.monitor = host, monitor
        self.keep_states, self.max_sessions = max(1, keep_states), max_sessions
        self.slots: dict[str, Slot] = {}
        self._lock = threading.Lock()  # guards `slots`

    # ---- sessions ----
    def slot(self, key: str) -> Slot:
        with self._lock:
            slot = self.slots.get(key)
            if slot is None:
                slot = self.slots[key] = Slot()
                idle = sorted((s.used, k) for k, s in self.slots.items() if k != key and not s.lock.locked())
                for _, old in idle[:max(0, len(self.slots) - self.max_sessions)]:
                    del self.slots[old]
            slot.used = time.monotonic()
            return slot

    def forget(self, key: str) -> None:
        """The tab went away: stop its turn and drop its conversation."""
        with self._lock:
            slot = self.slots.pop(key, None)
        if slot is not None:
            for flag in list(slot.stops):
                flag.set()

    def messages(self, key: str) -> list[dict]:
        slot = self.slot(key)
        conv = slot.chat.conv.messages if slot.chat else (slot.snap or {}).get("messages", [])
        return display(conv)

    def info(self, key: str) -> dict:
        """What this session holds: messages, history ids, whether its decode state is live, last stats."""
        slot = self.slot(key)
        chat = slot.chat
        return {"messages": len(chat.conv.messages) if chat else len((slot.snap or {}).get("messages", [])),
                "history_tokens": len(chat.history) if chat else len((slot.snap or {}).get("history", [])),
                "state_live": chat is not None and slot.generation == self.host.generation,
                "state_tokens": len(chat.session.state.ids) if chat else 0,  # what a next turn reuses
                "sampled": slot.sampled,
                "last": {k: v for k, v in (chat.last if chat else {}).items() if k != "stamps"}}

    def _session(self, slot: Slot, mode: str, system: str | None) -> str:
        """The slot's ChatSession on the current engine, rebuilt if its state was freed; returns a note."""
        host, note = self.host, ""
        system = system or None
        if slot.chat is not None and slot.generation == host.generation and slot.chat.system == system:
            slot.chat.set_mode(mode)
            return ""
        snap = slot.chat.snapshot() if slot.chat is not None else slot.snap
        chat = ChatSession(host.engine, host.tokenizer, mode, system, host.prompt_cache)
        if snap and [m for m in snap["messages"] if m["role"] != "system"]:
            messages = [m for m in snap["messages"] if m["role"] != "system"]
            if (snap.get("system") or None) == system:
                chat.restore(dict(snap, mode=mode), chat.session.state)  # same ids, forwarded again
                why = slot.notice or ("the engine was reopened" if slot.generation != host.generation
                                      else "this conversation's decode state had been freed")
                n = len(snap["history"])
                what = f"{n} tokens of history" if n else f"the conversation ({len(messages)} messages)"
                note = f"recomputing {what} ({why}); the result is exact"
                slot.notice = ""
            else:  # a new system prompt changes the rendering of everything after it
                head = [{"role": "system", "content": system}] if system else []
                chat.restore({"mode": mode, "system": system, "messages": head + messages, "history": []},
                             chat.session.state)
                slot.marks = []
                note = "the system prompt changed: recomputing the conversation with it"
        slot.chat, slot.snap, slot.generation = chat, None, host.generation
        return note

    def _evict(self, keep: Slot) -> None:
        """Free decode states beyond `keep_states`, least recently used first (idle sessions only)."""
        with self._lock:
            live = sorted((s.used, id(s), s) for s in self.slots.values() if s.chat is not None and s is not keep)
        for _, _, s in live[:max(0, len(live) + 1 - self.keep_states)]:
            if s.lock.acquire(blocking=False):
                try:
                    s.snap, s.chat = s.chat.snapshot(), None
                    s.notice = "this conversation's decode state had been freed for another session"
                finally:
                    s.lock.release()

    def free_states(self) -> None:
        """The engine was reopened: drop every idle decode state now (busy ones follow on their next turn)."""
        with self._lock:
            slots = list(self.slots.values())
        for s in slots:
            if s.chat is not None and s.lock.acquire(blocking=False):
                try:
                    s.snap, s.chat = s.chat.snapshot(), None
                finally:
                    s.lock.release()

    def reset_all(self, notice: str) -> None:
        """Another model was opened: every conversation starts over (its ids meant another vocabulary)."""
        with self._lock:
            slots = list(self.slots.values())
        for s in slots:
            for flag in list(s.stops):
                flag.set()
            with s.lock:
                s.chat, s.snap, s.marks, s.notice = None, None, [], notice

    # ---- a turn ----
    def reply(self, key: str, text: str, params, mode: str = "instruct", system: str | None = None
              ) -> Iterator[Update]:
        """Stream one turn. Closing this generator early stops the engine at the next token."""
        if len(text) > MAX_MESSAGE_CHARS or len(system or "") > MAX_MESSAGE_CHARS:
            what = "the message" if len(text) > MAX_MESSAGE_CHARS else "the system prompt"
            yield Update(self.messages(key), "error", f"{what} is {max(len(text), len(system or '')):,} characters, over "
                         f"the limit of {MAX_MESSAGE_CHARS:,}; nothing was sent and the conversation is as it was")
            return
        slot = self.slot(key)
        stop, events = threading.Event(), queue.Queue()
        slot.stops.add(stop)
        before = self.messages(key) + [{"role": "user", "content": text}]
        worker = threading.Thread(target=self._turn, args=(slot, text, params, mode, system, stop, events, label(key)),
                                  name=f"k3-turn-{key[:8]}", daemon=True)
        worker.start()
        thinking, answer, open_think, note = "", "", mode == "thinking", ""
        try:
            yield Update(before + partial("", "", False), "waiting", "waiting for the engine…")
            while True:
                try:
                    items = [events.get(timeout=POLL)]
                except queue.Empty:
                    continue
                while not events.empty():
                    items.append(events.get_nowait())
                final = None
                for kind, value in items:
                    if kind == "started":
                        before, note = value
                    elif kind == "text" and value.channel == "think":
                        thinking += value.text
                    elif kind == "text":
                        answer += value.text
                        open_think = False
                    elif kind in ("done", "error"):
                        final = (kind, value)
                if final is None:
                    yield Update(before + partial(thinking, answer, open_think), "running", note)
                    continue
                kind, value = final
                if kind == "error":
                    yield Update(before[:-1], "error", value)
                else:
                    status = "stopped" if value.reason == "cancelled" else "done"
                    yield Update(self.messages(key), status, turn_note(note, slot.chat.last, not params.greedy),
                                 dict(slot.chat.last))
                return
        finally:
            stop.set()  # a reply closed early: the worker stops at the next token boundary

    def _turn(self, slot: Slot, text: str, params, mode: str, system, stop: threading.Event, events, who: str
              ) -> None:
        host, monitor = self.host, self.monitor
        try:
            with slot.lock:
                if monitor:
                    monitor.queued(+1)
                try:
                    host.lock.acquire()
                finally:
                    if monitor:
                        monitor.queued(-1)
                try:
                    if stop.is_set():
                        events.put(("error", "stopped before it started"))
                        return
                    self._run(slot, text, params, mode, system, stop, events, who)
                finally:
                    host.lock.release()
        except Exception as exc:  # noqa: BLE001 - the person sees it; the session stays usable
            log.warning("session %s: turn failed: %s: %s", who, type(exc).__name__, exc)
            events.put(("error", f"{type(exc).__name__}: {exc}"))
        finally:
            slot.stops.discard(stop)
            slot.used = time.monotonic()

    def _run(self, slot: Slot, text: str, params, mode, system, stop, events, who: str = "-") -> None:
        """With both locks held: run ChatSession.ask, rolling back on failure."""
        note = self._session(slot, mode, system) or slot.notice
        slot.notice = ""
        self._evict(slot)
        chat = slot.chat
        events.put(("started", (display(chat.conv.messages) + [{"role": "user", "content": text}], note)))
        mark, touched, done = (len(chat.conv.messages), len(chat.history)), Touched(), None
        slot.sampled = not params.greedy
        speculation = self.host.speculation()
        if self.monitor:
            self.monitor.begin(note, sampled=slot.sampled, speculating=speculation is not None)
        observers = [touched] + ([self.monitor] if self.monitor else [])
        try:
            for event in chat.ask(text, params, cancelled=stop.is_set, observers=observers, speculation=speculation):
                if event.kind == "done":
                    done, s = event, event.stats
                    log.info("session %s: %d prompt tokens (%d reused), %d generated (%s), %s s/token", who,
                             s["prompt_tokens"], s["reused_tokens"], s["generated_tokens"], done.reason,
                             f"{s['seconds_per_token']:.3f}" if s["seconds_per_token"] else "-")
                events.put((event.kind, event))
            slot.marks.append(mark)
        except K3Error as exc:
            self._roll_back(chat, mark, touched)
            log.warning("session %s: turn refused: %s", who, exc)
            events.put(("error", str(exc)))
        except Exception as exc:
            self._roll_back(chat, mark, touched)
            events.put(("error", f"{type(exc).__name__}: {exc}"))
        finally:
            if self.monitor:
                self.monitor.end(done.stats if done else None, done.reason if done else "error")

    @staticmethod
    def _roll_back(chat: ChatSession, mark: tuple[int, int], touched: "Touched") -> None:
        """A failed turn: the conversation as before it; a state the engine touched is rebuilt
        from the exact history on the next turn."""
        del chat.conv.messages[mark[0]:]
        del chat.history[mark[1]:]
        if touched.yes:
            chat.session.reset()

    # ---- stop, undo, clear ----
    def stop(self, key: str, wait: float = 120.0) -> bool:
        """Stop this session's turn at the next token and wait (up to `wait` s) until it has ended."""
        slot = self.slot(key)
        for flag in list(slot.stops):
            flag.set()
        return self.wait_idle(key, wait)

    def wait_idle(self, key: str, timeout: float = 120.0) -> bool:
        slot, end = self.slot(key), time.monotonic() + timeout
        while slot.stops or slot.lock.locked():
            if time.monotonic() > end:
                return False
            time.sleep(0.02)
        return True

    def undo(self, key: str) -> str:
        """Drop the last exchange; returns its user text. The next turn recomputes the history
        before it (a recurrent state cannot be rewound), from the exact ids."""
        slot = self.slot(key)
        self.stop(key)
        with slot.lock:
            chat = slot.chat
            snap = chat.snapshot() if chat else slot.snap
            if not snap:
                return ""
            msgs = snap["messages"]
            users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
            if not users:
                return ""
            cut = users[-1]
            ids = next((h for m, h in slot.marks if m == cut), None)  # history ids before that turn
            slot.marks = [(m, h) for m, h in slot.marks if m < cut]
            history = snap["history"][:ids] if ids is not None else []  # none known: re-render
            slot.snap = {**snap, "messages": msgs[:cut], "history": history}
            slot.chat, slot.notice = None, "after the undo: a recurrent state cannot be rewound"
            return msgs[cut]["content"]

    def clear(self, key: str) -> None:
        slot = self.slot(key)
        self.stop(key)
        with slot.lock:
            if slot.chat is not None:
                slot.chat.reset()
            slot.snap, slot.marks, slot.notice = None, [], ""
