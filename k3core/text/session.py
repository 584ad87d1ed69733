"""A generation session: prompt ids in, sampled ids out, streamed as text events; the decode state is
kept between calls and reused whenever a new prompt strictly extends what was already consumed
(SPEC §4.5), so a follow-up chat turn forwards only its new tokens.

Used by `k3 run --prompt`, `k3 chat` and the browser UI. Cancellation is checked between tokens, so
a stop never leaves a half-updated decode state.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from .chat import CLOSE, EOM, OPEN, SEP
from .sampling import Sampler, SamplingParams, StopMatcher


@dataclass
class Event:
    kind: str                       # "text" (channel says where), "done"
    text: str = ""
    channel: str | None = None      # "think", "response", "tools" in chat mode; None for raw text
    ids: list[int] = field(default_factory=list)  # done: every id generated
    reason: str = ""                # done: "stop id", "stop string", "max tokens", "cancelled"
    stats: dict = field(default_factory=dict)


class Channels:
    """Tracks which XTML channel generated text belongs to; markup ids produce no text."""

    def __init__(self, tokenizer, first: str | None):
        self.ids = {name: tokenizer.id_of(name) for name in (OPEN, SEP, CLOSE, EOM)} \
            if first is not None and tokenizer is not None else {}
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


class Session:
    def __init__(self, engine, tokenizer):
        self.engine, self.tokenizer = engine, tokenizer
        self.state = engine.new_state()

    def reset(self) -> None:
        self.state = self.engine.new_state()

    def to_forward(self, prompt: Sequence[int]) -> list[int]:
        """The ids of `prompt` not yet consumed; the state is reset unless `prompt` extends it."""
        prompt, done = list(prompt), self.state.ids
        if len(prompt) > len(done) and prompt[:len(done)] == done:
            return prompt[len(done):]
        self.reset()
        return prompt

    def generate(self, prompt: Sequence[int], params: SamplingParams, *, stop_ids: Sequence[int] = (),
                 channel: str | None = None, cancelled: Callable[[], bool] = lambda: False,
                 on_logits: Callable | None = None, full_recompute: bool = False) -> Iterator[Event]:
        """Stream the reply to `prompt`. `channel`: the XTML channel the prompt's generation prefix
        opened (chat mode), or None for raw text. `full_recompute` forwards the whole sequence from a
        fresh state for every id (a check of the incremental path; the session state is then unused)."""
        engine, tok = self.engine, self.tokenizer
        pending = self.to_forward(prompt)
        reused = len(prompt) - len(pending)
        sampler, history = Sampler(params), list(prompt)
        decoder = tok.stream() if tok is not None else None  # without a tokenizer: ids only, no text events
        stops, channels = StopMatcher(params.stop_strings), Channels(tok, channel)
        stop_set = set(stop_ids) | set(params.stop_ids)
        generated, reason, stamps = [], "max tokens", []
        forwarded_before, started = engine.tokens_forwarded, time.perf_counter()
        for _ in range(params.max_tokens):
            if cancelled():
                reason = "cancelled"
                break
            logits = engine.forward(history, engine.new_state()) if full_recompute else \
                engine.forward(pending, self.state)
            if on_logits is not None:
                on_logits(logits)
            token = sampler.pick(logits, history)
            stamps.append(time.perf_counter())
            generated.append(token)
            history.append(token)
            pending = [token]
            if token in stop_set:
                reason = "stop id"
                break
            if decoder is None or channels.is_markup(token):
                continue
            text, stopped = stops.feed(decoder.push(token))
            if text:
                yield Event("text", text, channels.current)
            if stopped:
                reason = "stop string"
                break
        if decoder is not None and reason != "stop string":
            tail = stops.feed(decoder.flush())[0] + stops.flush()
            if tail:
                yield Event("text", tail, channels.current)
        yield Event("done", ids=generated, reason=reason, stats={
            "prompt_tokens": len(prompt), "reused_tokens": reused,
            "forwarded_tokens": engine.tokens_forwarded - forwarded_before, "generated_tokens": len(generated),
            "prefill_seconds": stamps[0] - started if stamps else 0.0,
            "seconds_per_token": (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else None,
            "seed": sampler.seed, "started": started, "stamps": stamps,
            "open_channel": channels.current if channels.open else None})
