"""A generation session, the upper of the two generation layers: prompt ids in, text events out. The
decode state is kept between calls and reused whenever a new prompt strictly extends what was already
consumed (MODEL.md §4.5), so a follow-up chat turn forwards only its new tokens. With a prompt cache
(prefix_cache.py) a prompt the session's state does not extend resumes from the longest kept prefix any
conversation left, the prompt's checkpoints are kept as it is forwarded, and the state each reply ends with.

Ids come from generate_ids (generate.py); TextStream (channels.py) turns them into text. Stop ids, max
tokens and cancellation are checked between tokens; while the prompt is forwarded, cancellation also
between layers, and a prompt stopped half-way drops the decode state (the next call forwards its whole
prompt again), never keeps a half-updated one.
Used by `k3 run --prompt`, `k3 chat` and the browser UI.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from ..errors import K3Error, UsageError
from ..interfaces import io_seconds
from ..model.observer import Observer
from .channels import Event, TextStream
from .generate import Speculation, generate_ids
from .sampling import Sampler, SamplingParams
from .structured import Grammar, reply_grammar

if TYPE_CHECKING:
    import numpy as np

    from ..model.engine import Engine
    from .prefix_cache import PrefixCache
    from ..text.tokenizer import Tokenizer


class Cancelled(K3Error):
    """A generation stopped from outside in the middle of a forward pass."""


class CancelBetweenLayers(Observer):
    """While the prompt is forwarded, ends the pass at the next layer once `cancelled()` says so: a stop
    takes one layer's time, not a whole prompt's; the half-advanced decode state is then dropped. Once
    ids are generated, a stop waits for the token under way, so the state stays whole and reusable."""

    def __init__(self, cancelled: Callable[[], bool]) -> None:
        self.cancelled, self.prefilling = cancelled, True

    def on_layer(self, layer: int, layers: int) -> None:
        if self.prefilling and self.cancelled():
            raise Cancelled("stopped")

    def on_token(self, token: int, logits: np.ndarray) -> None:
        self.prefilling = False


class DraftTally(Observer):
    """Counts the drafted ids verify passes checked and the ones the model agreed with."""

    def __init__(self) -> None:
        self.drafted = self.accepted = 0

    def on_draft(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted


def bytes_read(engine: Engine) -> int:
    """Trunk and expert bytes the engine has read from disk so far."""
    s = engine.stats()
    return s.get("trunk_bytes_read", 0) + s.get("expert_bytes_read", 0)


class Session:
    def __init__(self, engine: Engine, tokenizer: Tokenizer | None = None, prompt_cache: PrefixCache | None = None
                 ) -> None:
        self.engine, self.tokenizer, self.prompt_cache = engine, tokenizer, prompt_cache
        self.state = engine.new_state()

    def reset(self) -> None:
        self.state = self.engine.new_state()

    def schema_grammar(self, params: SamplingParams, channel: str | None, param: str = "json_schema"
                       ) -> Grammar | None:
        """The grammar `params.json_schema` asks of a reply starting in `channel`, or None; a schema that cannot
        be enforced is a SchemaError naming `param` (where the schema came from)."""
        if params.json_schema is None:
            return None
        if self.tokenizer is None:
            raise UsageError(f"{param}: structured output needs the model's tokenizer (Session(engine, tokenizer))")
        return Grammar(self.tokenizer, reply_grammar(params.json_schema, channel), param, chat=channel is not None)

    def to_forward(self, prompt: Sequence[int]) -> list[int]:
        """The ids of `prompt` not yet consumed; unless `prompt` extends what the state holds, the state becomes the
        prompt cache's longest kept prefix of it (or a fresh one)."""
        prompt, done = list(prompt), self.state.ids
        if done and len(prompt) > len(done) and prompt[:len(done)] == done:
            return prompt[len(done):]
        self.state = self.prompt_cache.resume(prompt) if self.prompt_cache is not None else self.engine.new_state()
        return prompt[len(self.state.ids):]

    def generate(self, prompt: Sequence[int], params: SamplingParams, *, stop_ids: Sequence[int] = (),
                 channel: str | None = None, cancelled: Callable[[], bool] = lambda: False,
                 observers: Sequence[Observer] = (), full_recompute: bool = False,
                 speculation: Speculation | None = None, grammar: Grammar | None = None) -> Iterator[Event]:
        """Stream the reply to `prompt`: text events, then one "done" event with the ids and stats.
        `channel`: the XTML channel the prompt's generation prefix opened (chat mode), or None for raw
        text. Without a tokenizer only the "done" event comes. `full_recompute` forwards the whole
        sequence from a fresh state for every id (the session state is then unused). `speculation` verifies
        drafted ids in batched passes: the same events, in fewer passes when the drafts are good.
        `params.json_schema` holds the reply to that schema (compiled here, for `channel`); `grammar`, a
        structured.Grammar, holds it to any other (a forced tool call's), instead."""
        engine, cache = self.engine, None if full_recompute else self.prompt_cache
        grammar = grammar or self.schema_grammar(params, channel)
        reused = len(prompt) - len(self.to_forward(prompt))
        sampler, tally = Sampler(params, grammar.constraint() if grammar else None), DraftTally()
        steps = generate_ids(engine, prompt, engine.new_state() if full_recompute else self.state, sampler,
                             observers=[CancelBetweenLayers(cancelled), tally, *observers],
                             full_recompute=full_recompute, speculation=speculation,
                             checkpoints=cache.positions(prompt, reused) if cache else (),
                             on_checkpoint=cache.keep if cache else None)
        text = TextStream(self.tokenizer, params.stop_strings, channel) if self.tokenizer is not None else None
        stop_set = set(stop_ids) | set(params.stop_ids) | set(grammar.stop_ids if grammar else ())
        generated: list[int]
        stamps: list[float]
        reads: list[int]  # bytes read from disk so far, at each stamp
        generated, reason, stamps, reads = [], "max tokens", [], []
        forwarded_before, passes_before, read_before = engine.tokens_forwarded, engine.forward_passes, bytes_read(engine)
        io_before = io_first = io_seconds(engine.stats())
        started = time.perf_counter()
        try:
            while len(generated) < params.max_tokens:
                if cancelled():
                    reason = "cancelled"
                    break
                try:
                    step = next(steps, None)
                except Cancelled:
                    self.reset()  # the state went part of the way through a pass: it is rebuilt from the ids
                    reason = "cancelled"
                    break
                if step is None:  # prompt and reply fill --max-context
                    reason = "context full"
                    break
                token = step[0]
                stamps.append(time.perf_counter())
                reads.append(bytes_read(engine))
                if len(stamps) == 1:
                    passes_first, read_first, io_first = engine.forward_passes, reads[0], io_seconds(engine.stats())
                generated.append(token)
                if token in stop_set:
                    reason = "stop id"
                    break
                if text is not None:
                    yield from text.feed(token)
                    if text.stopped:
                        reason = "stop string"
                        break
        finally:
            steps.close()
        if cache is not None and self.state.ids:  # whole (a pass cut short resets it): kept for any later prompt
            cache.keep(self.state)
        if text is not None:
            yield from text.finish()
        yield Event("done", ids=generated, reason=reason, stats={
            "prompt_tokens": len(prompt), "reused_tokens": reused,
            "forwarded_tokens": engine.tokens_forwarded - forwarded_before, "generated_tokens": len(generated),
            "forward_passes": engine.forward_passes - passes_before, "draft_proposed": tally.drafted,
            "draft_accepted": tally.accepted, "bytes_read": bytes_read(engine) - read_before,
            # decode only, like seconds_per_token: what each id after the first cost
            "decode_passes": engine.forward_passes - passes_first if stamps else 0,
            "bytes_read_per_token": (bytes_read(engine) - read_first) / (len(generated) - 1) if len(generated) > 1
            else None,
            "prefill_seconds": stamps[0] - started if stamps else 0.0,
            # the prompt's passes and the first id: bytes read, time with reads in flight, time waited for them
            "prefill_io": {"bytes_read": reads[0] - read_before if stamps else 0,
                           "read_seconds": io_first[0] - io_before[0], "wait_seconds": io_first[1] - io_before[1]},
            "seconds_per_token": (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else None,
            "seed": sampler.seed, "started": started, "stamps": stamps, "reads": reads,
            "open_channel": text.open_channel if text is not None else None})
