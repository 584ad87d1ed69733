"""The `suffix` draft source: proposals from every conversation this process has seen, not just the current one.

One index per process (`SuffixIndex.shared()`), a generalised suffix automaton over documents: each generation's
prompt and the ids it emits form a document, and a follow-up whose prompt extends a finished document continues
that document instead of adding the conversation again. A state is a set of substrings that end at the same
places; `count` is how many places (document, position) that is, so following the transition whose target has
the highest count continues a matched suffix the way it continued most often.

A proposal starts from the longest suffix of the current sequence that occurred earlier with something after it
(the current document's own state, up its suffix links until one has a transition) and follows the best-supported
transitions while each is taken by at least MIN_SHARE of the occurrences, for at most MATCH_SCALE × the match
length ids (a long match earns a long proposal; a one-id match proposes little). Drafts never change an id:
the engine verifies them.

Memory is bounded: past `capacity` ids the documents used least recently are dropped (never one a generation is
still writing) and the automaton is rebuilt from the rest, down to three quarters of the capacity. Counts on
very repetitive text are capped at COUNT_CHAIN states per added id (support there is a lower bound).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Sequence

from ..plugin_api import DraftSource, UsageError, hookimpl

BYTES_PER_ID = 600         # memory per id of capacity: 531-555 B peak RSS measured (make bench-suffix), with room
DEFAULT_BYTES = 64 << 20   # the index's memory when nothing sets it (--draft-memory)
MATCH_SCALE = 2.0          # a proposal is at most this many times the matched suffix's length
MIN_SHARE = 0.3            # each proposed id continues at least this share of the occurrences before it
MIN_MATCH = 2              # shorter matched suffixes propose nothing
COUNT_CHAIN = 64           # suffix-link states whose counts an added id raises, at most
MAX_FANOUT = 256           # a state with more continuations than this is not worth a proposal


class _Document:
    __slots__ = ("tokens", "dropped", "last", "active")

    def __init__(self):
        self.tokens: list[int] = []
        self.dropped = 0       # ids cut from its start to keep the index within its capacity
        self.last = 0          # the automaton state of the whole document
        self.active = False    # a generation is writing it: never dropped, never continued by another


class SuffixIndex:
    """A bounded generalised suffix automaton over token documents; thread-safe."""

    _shared: "SuffixIndex | None" = None
    _shared_lock = threading.Lock()

    def __init__(self, capacity: int):
        if capacity < 1:
            raise UsageError(f"the suffix index needs room for at least one id, got {capacity}")
        self.capacity = capacity
        self.documents: OrderedDict[int, _Document] = OrderedDict()  # least recently used first
        self.lock = threading.Lock()
        self._ids = 0
        self._clear()

    @classmethod
    def shared(cls, capacity: int | None = None) -> "SuffixIndex":
        """The process's index; `capacity` (ids) resizes it when given."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls(capacity or DEFAULT_BYTES // BYTES_PER_ID)
            elif capacity is not None and capacity != cls._shared.capacity:
                cls._shared.resize(capacity)
            return cls._shared

    def _clear(self) -> None:
        self.next: list[dict[int, int]] = [{}]
        self.link = [-1]
        self.length = [0]
        self.count = [0]
        self.held = 0

    # ---- documents ----------------------------------------------------------------------------------------
    def open(self, prompt: Sequence[int]) -> _Document:
        """The document a generation after `prompt` writes: a finished one that `prompt` extends (continued),
        else a new one; the rest of `prompt` is added to it."""
        with self.lock:
            doc = self._continued(prompt) or self._new()
            doc.active = True
            self._add(doc, prompt[doc.dropped + len(doc.tokens):])
            return doc

    def close(self, doc: _Document) -> None:
        with self.lock:
            doc.active = False

    def extend(self, doc: _Document, history: Sequence[int]) -> None:
        """Add the ids of `history` (which extends the document) it does not hold yet."""
        with self.lock:
            self._add(doc, history[doc.dropped + len(doc.tokens):])

    def _continued(self, prompt: Sequence[int]) -> _Document | None:
        """A finished document `prompt` extends (a cut document: one whose kept ids are where `prompt` has them)."""
        for key, doc in reversed(self.documents.items()):
            start, end = doc.dropped, doc.dropped + len(doc.tokens)
            if not doc.active and start < end <= len(prompt) and prompt[end - 1] == doc.tokens[-1] \
                    and list(prompt[start:end]) == doc.tokens:
                self.documents.move_to_end(key)
                return doc
        return None

    def _new(self) -> _Document:
        self._ids += 1
        self.documents[self._ids] = doc = _Document()
        return doc

    def _add(self, doc: _Document, ids: Sequence[int]) -> None:
        for token in ids:
            doc.last = self._extend(doc.last, int(token))
            doc.tokens.append(int(token))
        self.held += len(ids)
        if self.held > self.capacity:
            self._evict()

    def resize(self, capacity: int) -> None:
        with self.lock:
            self.capacity = capacity
            if self.held > capacity:
                self._evict()

    def _evict(self) -> None:
        """Drop the least recently used finished documents down to 3/4 of the capacity; rebuild from the rest."""
        target = self.capacity * 3 // 4
        total = self.held
        for key in [k for k, d in self.documents.items() if not d.active]:
            if total <= target:
                break
            total -= len(self.documents.pop(key).tokens)
        for doc in self.documents.values():  # what is still over: the oldest ids of the longest documents
            if total > target and len(doc.tokens) > target // max(1, len(self.documents)):
                cut = min(len(doc.tokens) - target // max(1, len(self.documents)), total - target)
                del doc.tokens[:cut]
                doc.dropped += cut
                total -= cut
        self._clear()
        for doc in self.documents.values():
            doc.last = 0
            for token in doc.tokens:
                doc.last = self._extend(doc.last, token)
            self.held += len(doc.tokens)

    # ---- the automaton --------------------------------------------------------------------------------------
    def _state(self, length: int, link: int, nxt: dict, count: int) -> int:
        self.next.append(nxt)
        self.link.append(link)
        self.length.append(length)
        self.count.append(count)
        return len(self.length) - 1

    def _clone(self, p: int, q: int, c: int) -> int:
        """Split state q so the strings of length length[p] + 1 get their own state; redirect p's chain to it."""
        clone = self._state(self.length[p] + 1, self.link[q], dict(self.next[q]), self.count[q])
        nxt, link = self.next, self.link
        while p != -1 and nxt[p].get(c) == q:
            nxt[p][c] = clone
            p = link[p]
        link[q] = clone
        return clone

    def _extend(self, last: int, c: int) -> int:
        """The state of (last's strings) + c, with every state that gains an end position counted."""
        nxt, link, length, count = self.next, self.link, self.length, self.count
        q = nxt[last].get(c)
        if q is not None:  # this document's string already occurred (in another document, or earlier in it)
            state = q if length[last] + 1 == length[q] else self._clone(last, q, c)
        else:
            state = len(length)
            nxt.append({})
            link.append(0)
            length.append(length[last] + 1)
            count.append(0)
            p = last
            while p != -1 and c not in nxt[p]:
                nxt[p][c] = state
                p = link[p]
            if p != -1:
                q = nxt[p][c]
                link[state] = q if length[p] + 1 == length[q] else self._clone(p, q, c)
        s, steps = state, COUNT_CHAIN
        while s > 0 and steps:
            count[s] += 1
            s = link[s]
            steps -= 1
        return state

    # ---- proposals ------------------------------------------------------------------------------------------
    def propose(self, doc: _Document, k: int) -> list[int]:
        """Up to k ids continuing the document as its longest earlier-seen suffix continued most often."""
        with self.lock:
            nxt, link, length, count = self.next, self.link, self.length, self.count
            s = doc.last
            while s > 0 and not nxt[s]:
                s = link[s]
            if s <= 0 or length[s] < MIN_MATCH or len(nxt[s]) > MAX_FANOUT:
                return []
            out: list[int] = []
            limit = min(k, int(MATCH_SCALE * length[s]))
            while len(out) < limit:
                children = nxt[s]
                if not children or len(children) > MAX_FANOUT:
                    break
                token, t = max(children.items(), key=lambda kv: (count[kv[1]], -kv[0]))  # ties: the lowest id
                if count[t] < MIN_SHARE * count[s]:
                    break
                out.append(token)
                s = t
            return out


class SuffixDraft(DraftSource):
    name = "suffix"
    description = ("suffix lookup: continue the longest earlier-seen suffix the way it continued most often, over "
                   "every conversation this process has served (bounded: --draft-memory)")
    memory_bytes = DEFAULT_BYTES

    @classmethod
    def reserve(cls, memory_bytes):
        SuffixIndex.shared(max(1, memory_bytes // BYTES_PER_ID))

    def __init__(self, argument=None):
        super().__init__(argument)
        if argument is not None:
            raise UsageError(f"--draft suffix takes no argument (its memory is --draft-memory), got suffix:{argument}")
        self.index, self.doc, self.vocab = SuffixIndex.shared(), None, None

    def check(self, vocab_size):
        self.vocab = vocab_size

    def begin(self, prompt):
        if self.doc is not None:  # a generation that was never ended: its document is finished now
            self.index.close(self.doc)
        self.doc = self.index.open(list(prompt))

    def propose(self, history, generated, k):
        if self.doc is None:
            self.begin(history)
        self.index.extend(self.doc, history)
        ids = self.index.propose(self.doc, k)
        if self.vocab is not None:  # the index is the process's: another model's documents may hold ids past this one's
            ids = ids[:next((i for i, t in enumerate(ids) if t >= self.vocab), len(ids))]
        return ids

    def end(self, history):
        if self.doc is not None:
            self.index.extend(self.doc, history)
            self.index.close(self.doc)
            self.doc = None


@hookimpl(trylast=True)
def k3_draft_sources():
    return [SuffixDraft]
