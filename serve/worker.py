"""The resident worker: one engine, one thread that advances every admitted request together.

Requests wait in a bounded queue; up to `engine.sequences` of them are in the batch at once, advanced one
forward pass per step (`BatchGenerator`: each reply is the bits it gets alone). With a prompt cache
(`PrefixCache`) a request starts from the state kept at the deepest checkpoint whose ids begin its prompt —
whichever conversation left it — so a follow-up turn, or another conversation with the same system prompt and
tools, forwards only what is new; its prompt's checkpoints (message boundaries, cache_control breakpoints, every
interval) are kept as it is forwarded, and its state when it ends — stopped, finished, cut off or cancelled. A
pass that fails ends only the requests in it; a request whose own part fails (its grammar cannot go on, its
events cannot be made) ends alone, and the others in the pass go on with the ids they get without it. The worker
goes on.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from k3core import BatchGenerator, PrefixCache, Sampler, SamplingParams, token_logprobs
from k3core.errors import InputError, K3Error
from k3core.generation.batch import SequenceFailed
from k3core.generation.channels import TextStream
from k3core.generation.structured import GrammarError

from .schema import ApiError

log = logging.getLogger("k3.serve")


@dataclass
class Job:
    """One request for ids: what to generate, and where its events go (`emit` is called on the worker
    thread with ("token", id) for each id of a chat reply, ("logprob", TokenLogprob) for each id when
    `logprobs` is set, ("text", channel, text), then ("done", reason, stats) or ("error", ApiError); with
    `score_prompt`, ("prompt_logprobs", [None, TokenLogprob, …]) for the prompt's ids comes before the first id's.
    With `echo_only` no id comes: the prompt's pass ends the job ("done", "length"). The done stats hold them all
    too: "logprobs" (one per id) and "prompt_logprobs".)"""

    prompt: list[int]
    params: SamplingParams
    emit: Callable[[tuple], None]
    channel: str | None = None        # the XTML channel the prompt's generation prefix opened (chat)
    forced: list[int] = field(default_factory=list)  # ids at the prompt's end the reply is parsed from too
    stop_ids: frozenset = frozenset()
    grammar: object = None            # the reply's Grammar (k3core.generation.structured): a JSON schema, forced calls
    grammar_param: str = "response_format"  # the request field a failing grammar is named by
    logprobs: int | None = None       # alternatives per id of its log-probabilities; None: none are computed
    score_prompt: bool = False        # the prompt's ids' log-probabilities too (teacher-forced; a fresh state)
    echo_only: bool = False           # the prompt alone (max_tokens 0 with echo): no id generated
    checkpoints: tuple[int, ...] = ()  # prompt positions whose state the prompt cache keeps (cache_control)
    cancelled: threading.Event = field(default_factory=threading.Event)
    # filled in by the worker
    generated: list[int] = field(default_factory=list)
    cached: int = 0                   # prompt ids the prompt cache gave
    stored: int = 0                   # prompt ids, past those, that the prompt cache kept when it ended
    started: float = 0.0
    text: TextStream | None = None
    state: object = None
    scores: list = field(default_factory=list)  # a TokenLogprob per generated id, when `logprobs` is set
    prompt_logprobs: list = field(default_factory=lambda: [None])  # the first prompt id has no logprob


@dataclass
class EngineSlot:
    """What the worker drives: the engine, its tokenizer, the prompt cache over that engine (a PrefixCache, or
    None), the lock every forward pass takes (shared with a browser UI on the same engine) and a generation number
    that changes when the engine is reopened (and the prompt cache with it)."""

    engine: object
    tokenizer: object
    prompt_cache: PrefixCache | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    generation: int = 0


class Worker:
    def __init__(self, slot: EngineSlot, queue_size: int = 16, speculation: Callable[[], object] = lambda: None):
        self.slot, self.queue_size = slot, queue_size
        self.speculation = speculation  # a fresh k3core.Speculation per request, or None (--speculate)
        self._pending: deque[Job] = deque()
        self._active: dict[int, Job] = {}
        self._wake = threading.Condition()
        self._stop = False
        self._generation = slot.generation
        self._batch = BatchGenerator(slot.engine)
        self.completed = self.failed = 0
        self.seconds_per_job = 1.0  # a running mean, for Retry-After
        self._thread = threading.Thread(target=self._run, name="k3-serve-worker", daemon=True)
        self._thread.start()

    # ---- the HTTP side ------------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Queue `job`, or raise ApiError 429 (with Retry-After) when the queue is full."""
        with self._wake:
            if self._stop:
                raise ApiError(503, "the server is shutting down", code="shutting_down")
            if len(self._pending) >= self.queue_size:
                wait = max(1, round(self.seconds_per_job * (len(self._pending) + 1) / max(1, self.slot.engine.sequences)))
                raise ApiError(429, f"the queue is full ({self.queue_size} requests waiting, --queue-size); retry "
                               f"in about {wait} s", code="queue_full", headers={"Retry-After": str(wait)})
            job.started = time.perf_counter()
            self._pending.append(job)
            self._wake.notify()

    def stats(self) -> dict:
        with self._wake:
            return {"active": len(self._active), "queued": len(self._pending), "completed": self.completed,
                    "failed": self.failed, **(self.cache.stats() if self.cache is not None else {})}

    @property
    def cache(self) -> PrefixCache | None:
        return self.slot.prompt_cache

    def close(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        self._thread.join(timeout=60)

    # ---- the worker thread --------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stop and not self._pending and not self._active:
                    self._wake.wait()
                if self._stop:
                    break
            try:
                self._step()
            except Exception as exc:  # never leave the worker dead with requests waiting on it
                self._fail_active(exc)
        for job in [*self._active.values(), *self._pending]:
            job.emit(("error", ApiError(503, "the server is shutting down", code="shutting_down")))

    def _step(self) -> None:
        with self.slot.lock:
            if self.slot.generation != self._generation:
                self._engine_changed()
            self._drop_cancelled()
            self._admit()
            if not self._batch.sequences:
                return
            failed = {}
            try:
                emitted = self._batch.step()
            except SequenceFailed as exc:  # some requests' own picks failed: they end, the others' ids stand
                emitted, failed = exc.emitted, exc.failed
            except Exception as exc:  # the pass failed: every request in it ends, the worker goes on
                self._fail_active(exc)
                return
        for handle, exc in failed.items():
            self._fail(handle, exc)
        for handle in dict.fromkeys(e.handle for e in emitted):  # a speculating sequence may emit several ids
            try:
                for used, e in enumerate((e for e in emitted if e.handle == handle), start=1):
                    if self._emitted(handle, e, used):
                        break
            except Exception as exc:  # making this request's events failed: it ends alone
                self._fail(handle, exc)

    def _engine_changed(self) -> None:
        self._fail_active(K3Error("the engine was reopened (new memory budgets); send the request again"))
        self._generation = self.slot.generation

    def _admit(self) -> None:
        engine = self.slot.engine
        while len(self._batch) < engine.sequences:
            with self._wake:
                if not self._pending:
                    return
                job = self._pending.popleft()
            if job.cancelled.is_set():
                continue
            # a scored prompt is forwarded whole: a kept state holds no logits for the positions it saves
            cache = self.cache
            state = engine.new_state() if job.score_prompt or cache is None else cache.resume(job.prompt)
            try:
                sampler = Sampler(job.params, job.grammar.constraint() if job.grammar is not None else None)
                handle = self._batch.add(job.prompt, state, sampler, self.speculation(),
                                         prompt_rows=self._prompt_scorer(job) if job.score_prompt else None,
                                         checkpoints=cache.positions(job.prompt, len(state.ids), job.checkpoints)
                                         if cache else (), on_checkpoint=cache.keep if cache else None)
            except InputError as exc:
                job.emit(("error", ApiError(400, str(exc), param="messages", code="context_length_exceeded"
                                            if "context limit" in str(exc) else "invalid_value")))
                continue
            except Exception as exc:  # a draft source or the engine refused it: this request ends, not the worker
                self.failed += 1
                job.emit(("error", ApiError(500, f"could not start the generation: {exc}", code="engine_error")))
                continue
            job.state, job.cached = state, len(state.ids)
            job.text = TextStream(self.slot.tokenizer, job.params.stop_strings, job.channel)
            for token in job.forced:  # markup the prompt forced (a tool call's opening): no text, but channels
                job.text.feed(token)
            self._active[handle] = job

    @staticmethod
    def _prompt_scorer(job: Job):
        """Appends to `job.prompt_logprobs` the log-probability of each prompt id after the first, from the rows
        of the prompt chunks (row j predicts the id after it; the last prompt row predicts the first reply id)."""
        def score(rows) -> None:
            for row in rows:
                at = len(job.prompt_logprobs)
                if at < len(job.prompt):
                    job.prompt_logprobs.append(token_logprobs(row, job.prompt[at], job.logprobs))
        return score

    def _emitted(self, handle: int, e, used: int) -> bool:
        """One id for a job (`e`, the `used`-th Emitted of its step); True when that ended the job."""
        job, token, context_full = self._active[handle], e.token, e.last
        if job.score_prompt and not job.generated:
            job.emit(("prompt_logprobs", list(job.prompt_logprobs)))
        if job.echo_only:  # the prompt's pass picked an id no one asked for: dropped, never sent
            return self._finish(handle, "length", used)
        job.generated.append(token)
        if job.logprobs is not None:
            job.scores.append(token_logprobs(e.logits, token, job.logprobs))
            job.emit(("logprob", job.scores[-1]))
        if job.channel is not None:  # chat: the stream parses tool calls from the ids as they come
            job.emit(("token", token))
        if token in job.stop_ids or token in job.params.stop_ids:
            return self._finish(handle, "stop", used)
        for event in job.text.feed(token):
            job.emit(("text", event.channel, event.text))
        if job.text.stopped:
            return self._finish(handle, "stop", used)
        if len(job.generated) >= job.params.max_tokens or context_full:
            return self._finish(handle, "length", used)
        return False

    def _drop_cancelled(self) -> None:
        for handle, job in list(self._active.items()):
            if job.cancelled.is_set():
                self._finish(handle, "cancelled")

    def _finish(self, handle: int, reason: str, used: int | None = None) -> bool:
        job = self._active.pop(handle)
        self._batch.remove(handle, used)  # the ids of its last step after the one it stopped at are not kept
        if self.cache is not None:
            self.cache.keep(job.state)  # whole: it holds every id but the last one generated
            job.stored = len(job.prompt) - job.cached  # the whole prompt is kept now, as the state's prefix
        for event in job.text.finish():
            job.emit(("text", event.channel, event.text))
        elapsed = time.perf_counter() - job.started
        self.seconds_per_job = 0.8 * self.seconds_per_job + 0.2 * elapsed
        self.completed += 1
        job.emit(("done", reason, {"prompt_tokens": len(job.prompt), "completion_tokens": len(job.generated),
                                   "cached_tokens": job.cached, "stored_tokens": job.stored,
                                   "ids": list(job.generated),
                                   "logprobs": list(job.scores),
                                   "prompt_logprobs": list(job.prompt_logprobs) if job.score_prompt else None}))
        return True

    def _fail(self, handle: int, exc: Exception) -> None:
        """One request ends with an error, the others go on: a grammar that cannot go on is a 400 naming the field
        its schema came from (llguidance's state goes to the debug log only), anything else a 500."""
        job = self._active.pop(handle, None)
        if job is None:
            return
        self._batch.remove(handle)  # a no-op when the batch already let it go; its state is not kept
        self.failed += 1
        if isinstance(exc, GrammarError):
            log.info("a reply's grammar could not go on after %d ids; that request ends: %s", exc.ids, exc.reason)
            log.debug("the grammar engine's state: %s", exc.detail)
            param = job.grammar_param
            job.emit(("error", ApiError(400, f"{param}: the grammar engine could not go on after {exc.ids} ids of the "
                                       f"reply ({exc.reason}), so the reply was ended; a simpler schema (shorter "
                                       "patterns, fewer alternatives) can be enforced", param=param,
                                       code="invalid_value")))
            return
        log.error("a request failed and ends alone: %s: %s", type(exc).__name__, exc, exc_info=exc)
        job.emit(("error", ApiError(500, f"generation failed: {type(exc).__name__}: {str(exc)[:500]}",
                                    code="engine_error")))

    def _fail_active(self, exc: Exception) -> None:
        log.error("a forward pass failed; the %d request(s) in it end: %s", len(self._active), exc)
        for job in self._active.values():
            self.failed += 1
            job.emit(("error", ApiError(500, f"generation failed: {exc}", code="engine_error")))
        self._active.clear()
        self._batch = BatchGenerator(self.slot.engine)  # their states may be half-advanced: dropped, never kept
