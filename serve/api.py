"""What the routes of every dialect share (serve/app.py puts them on one APIRouter): the `Api` object over the
worker, its engine and tokenizer, and the options; reading a request body (over `max_body_bytes` it is refused
with 413 before it is parsed); the API key (with one set, every /v1 route needs it, compared in constant time,
never logged); a chat request as a Job; a finished reply as chat completions' message, and its tool calls as
they close; a route that answers an ApiError in its dialect's shape, and any other exception as a 500 in that
shape too (the traceback goes to the log, never to the client). Imports none of the dialects.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import secrets
from dataclasses import dataclass, replace

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect
from k3core import SamplingParams
from k3core.errors import InputError, TokenizerError, UsageError
from k3core.files.limits import LimitError, loads_limited
from k3core.text.chat import (ChatInputError, build_ids as build_chat_ids, forced_tool_prefix, parse_tool_calls,
                              render as render_chat, split_reply)
from k3core.generation.structured import Grammar, SchemaError, chat_grammar

from .http import model_id
from .schema import ApiError, ChatRequest, CompletionRequest, prompt_param, request_param
from .worker import Job, Worker

log = logging.getLogger("k3.serve")

EOM = "<|end_of_msg|>"
FINISH = {"stop": "stop", "length": "length", "cancelled": "stop"}


@dataclass(frozen=True)
class ApiOptions:
    api_key: str | None = None         # None: no key asked (loopback only)
    max_body_bytes: int = 4 << 20      # larger request bodies are refused with 413
    default_max_tokens: int = 1024     # when a request names none (never over the context left)
    created: int = 0


def error_response(err: ApiError):
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def check_key(request, opts: ApiOptions) -> None:
    if opts.api_key is None:
        return
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), opts.api_key.encode()):
        raise ApiError(401, "a valid API key is required: send `Authorization: Bearer KEY`", code="invalid_api_key")


async def read_json(request, limit: int):
    """The body parsed as JSON, read no further than `limit` bytes (413 past it) and nested no deeper than
    k3 parses (400)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body is {int(declared)} bytes, over the limit of {limit} (--max-body-bytes)",
                       code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the request body is over the limit of {limit} bytes (--max-body-bytes)",
                           code="request_too_large")
        chunks.append(chunk)
    try:
        return loads_limited(b"".join(chunks) or b"null", "the request body")
    except LimitError as exc:  # nested deeper than k3 parses (docs/LIMITS.md)
        raise ApiError(400, str(exc), code="invalid_json") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not JSON: {exc}", code="invalid_json") from None


class Api:
    """What the routes share: the worker, its engine and tokenizer, the options."""

    def __init__(self, worker: Worker, opts: ApiOptions):
        self.worker, self.opts = worker, opts

    @property
    def engine(self):
        return self.worker.slot.engine

    @property
    def tokenizer(self):
        return self.worker.slot.tokenizer

    @property
    def model_id(self) -> str:
        """What /v1/models lists and requests name (the checkpoint directory's name; "k3" is accepted too)."""
        return model_id(self.engine.checkpoint.root)

    def check_model(self, name: str) -> None:
        if name not in (self.model_id, "k3"):
            raise ApiError(404, f"model {name!r} is not served here; GET /v1/models lists {self.model_id!r}",
                           param="model", code="model_not_found")

    def model_card(self) -> dict:
        return {"id": self.model_id, "object": "model", "created": self.opts.created, "owned_by": "k3",
                "context_length": self.engine.max_context}

    def params(self, sampling, mode: str, prompt_len: int, param: str = "messages") -> SamplingParams:
        """The sampler's parameters for a prompt of `prompt_len` ids; one that leaves no room for a reply is a 400
        naming `param`, where the request holds the prompt."""
        left = self.engine.max_context - prompt_len
        if left < 1:
            raise ApiError(400, f"the prompt is {prompt_len} tokens, and the context limit is {self.engine.max_context} "
                           "(--max-context): no room for a reply", param=param, code="context_length_exceeded")
        temperature = sampling.temperature
        if temperature is None:
            temperature = SamplingParams.suggested(mode).temperature
        max_tokens = min(sampling.max_tokens or self.opts.default_max_tokens, left)
        return SamplingParams(temperature=temperature, top_p=sampling.top_p, top_k=sampling.top_k, min_p=sampling.min_p,
                              repetition_penalty=sampling.repetition_penalty, seed=sampling.seed, max_tokens=max_tokens,
                              stop_strings=sampling.stop)

    def chat_job(self, req: ChatRequest, counting: bool = False) -> tuple[Job, str]:
        """The job for a chat request, and its mode. `counting` (count_tokens): the prompt is built and counted
        whatever its length, and no room for a reply is asked."""
        mode = "thinking" if req.thinking else "instruct"
        channel = "think" if req.thinking else "response"
        tools = req.tools if req.tool_choice != "none" else ()
        try:
            grammar = self.grammar(req, channel, tools)  # a schema is checked before the prompt is built
            prompt = render_chat(list(req.messages), self.tokenizer, mode, tools=list(tools) or None)
            forced = []
            if req.tool_choice not in (None, "none"):
                name = None if req.tool_choice == "required" else req.tool_choice
                forced = build_chat_ids(self.tokenizer, forced_tool_prefix(mode, name))
        except ChatInputError as exc:  # a message's text that would become markup; tools that cannot be declared
            param = request_param(exc.param)
            raise ApiError(400, f"{param}: {exc.problem}", param=param, code="invalid_value") from None
        except TokenizerError as exc:  # a model without K3's chat markup (a bare test model) cannot chat
            raise ApiError(400, f"this model cannot chat: {exc}", param="messages", code="invalid_value") from None
        except UsageError as exc:
            raise ApiError(400, str(exc), param="messages", code="invalid_value") from None
        prompt += forced
        if counting:
            return Job(prompt, SamplingParams(), emit=None), mode
        params = self.params(req.sampling, mode, len(prompt))
        if forced:  # the reply is the calls alone, ended by their grammar: no text for a stop string to end, and a
            params = replace(params, stop_strings=())  # stop string matched in their arguments would cut them
        stops = frozenset({self.tokenizer.id_of(EOM), *(grammar.stop_ids if grammar else ())})
        return Job(prompt, params, emit=None, channel=channel, forced=forced, grammar=grammar, stop_ids=stops,
                   grammar_param=grammar_param(req), logprobs=req.logprobs,
                   checkpoints=self.breakpoint_positions(req, mode, tools, prompt)), mode

    def breakpoint_positions(self, req: ChatRequest, mode: str, tools, prompt: list[int]) -> tuple[int, ...]:
        """The prompt positions of the request's cache_control breakpoints: for each, the ids the text up to it
        renders to that the whole prompt starts with (a breakpoint inside a word keeps the ids before the word)."""
        out = set()
        for index, offset in req.breakpoints:
            message = req.messages[index]
            head = [*req.messages[:index], {**message, "content": message["content"][:offset]}]
            ids = render_chat(head, self.tokenizer, mode, tools=list(tools) or None, add_generation_prompt=False)
            same = next((i for i, (a, b) in enumerate(zip(ids, prompt)) if a != b), min(len(ids), len(prompt)))
            if 0 < same < len(prompt):
                out.add(same)
        return tuple(sorted(out))

    def grammar(self, req: ChatRequest, channel: str, tools) -> Grammar | None:
        """What holds the reply to the request's schema, or forced tool calls to their tools' parameters."""
        try:
            return chat_grammar(self.tokenizer, channel, schema=req.response_schema, schema_param=req.schema_param,
                                tools=tools, tool_choice=req.tool_choice, parallel_calls=req.parallel_calls)
        except SchemaError as exc:
            param = tool_place(req, exc.param)
            raise ApiError(400, f"{param}: {exc.problem}", param=param, code="invalid_value") from None

    def prompt_ids(self, prompt: str | tuple[int, ...], param: str = "prompt") -> list[int]:
        """A completion prompt's ids: text encoded, or the ids given, each checked against the vocabulary (a 400
        naming `param`)."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        try:
            self.engine.check_ids(prompt)
            self.tokenizer.decode(prompt)
        except InputError as exc:
            raise ApiError(400, f"{param}: {exc}", param=param, code="invalid_value") from None
        return list(prompt)

    def prompt_text(self, prompt: str | tuple[int, ...]) -> str:
        """What `echo` returns: the prompt's text (its ids decoded when ids were given)."""
        return prompt if isinstance(prompt, str) else self.tokenizer.decode(prompt)

    def completion_jobs(self, req: CompletionRequest) -> list[Job]:
        """A job per prompt, every prompt checked before any job starts. `max_tokens` 0 (only with echo): the
        prompt alone, scored when `logprobs` asks, and no id generated (`echo_only`)."""
        echo_only = req.sampling.max_tokens == 0
        sampling = replace(req.sampling, max_tokens=1) if echo_only else req.sampling
        jobs = []
        for i, prompt in enumerate(req.prompts):
            param = prompt_param(len(req.prompts), i)
            ids = self.prompt_ids(prompt, param)
            if not ids:
                raise ApiError(400, f"{param}: encodes to no tokens", param=param, code="invalid_value")
            jobs.append(Job(ids, self.params(sampling, "instruct", len(ids), param), emit=None, logprobs=req.logprobs,
                            score_prompt=req.echo and req.logprobs is not None, echo_only=echo_only))
        return jobs

    def start(self, job: Job) -> asyncio.Queue:
        """Submit `job`; its events arrive on the returned queue (thread-safe hand-over to this loop)."""
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        job.emit = lambda event: loop.call_soon_threadsafe(events.put_nowait, event)
        self.worker.submit(job)
        return events


def tool_place(req: ChatRequest, param: str) -> str:
    """k3core's name for a tool's schema (`tools[J].parameters`) as the request's body names it."""
    at = re.fullmatch(r"tools\[(\d+)\]\.parameters", param)
    return req.tool_places[int(at[1])] if at and int(at[1]) < len(req.tool_places) else param


def grammar_param(req: ChatRequest) -> str:
    """The field a grammar that fails mid-reply is named by: the forced tool's schema (the one tool's, when
    `required` has one to call), the response schema, or `tools`."""
    names = [t["name"] for t in req.tools]
    if req.tool_choice in names or (req.tool_choice == "required" and len(names) == 1):
        return tool_place(req, f"tools[{0 if req.tool_choice == 'required' else names.index(req.tool_choice)}]"
                               ".parameters")
    if req.response_schema is not None and req.tool_choice != "required":
        return req.schema_param
    return "tools"


def chat_job(api: Api, req: ChatRequest, places: list[str], counting: bool = False):
    """chat completions' job for a request another dialect's body was read into (Messages, Responses): an error
    in a rendered message names where that body holds it (`places[i]`: where messages[i] came from)."""
    try:
        return api.chat_job(req, counting)
    except ApiError as err:
        at = re.match(r"messages\[(\d+)\]", err.param or "")
        if at:
            err.param = places[int(at[1])]
            err.message = f"{err.param}: {err.message.partition(': ')[2]}"
        raise


def chat_reply(api: Api, job: Job, mode: str, stats: dict, reason: str, texts: dict) -> tuple[dict, str]:
    """The assistant message of a finished chat job, and its finish_reason. Content and reasoning are the
    text the stream sent (a stop string cuts them where it began); tool calls are parsed from the ids."""
    reply = split_reply(job.forced + stats["ids"], api.tokenizer, mode)
    message = {"role": "assistant", "content": "".join(texts.get("response", []))}
    if mode == "thinking" or "think" in texts:
        message["reasoning_content"] = "".join(texts.get("think", []))
    # a call cut off by the token limit is left out (its arguments are not whole); finish_reason "length" says so
    calls = [c for c in parse_tool_calls(reply.tools or "") if c.name and c.complete]
    finish = FINISH[reason]
    if calls:
        message["tool_calls"] = [_call_json(c) for c in calls]
        if finish == "stop":
            finish = "tool_calls"
    return message, finish


def _call_json(call) -> dict:
    return {"id": f"call_{secrets.token_hex(8)}", "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}


def _complete_calls(api: Api, job: Job, mode: str, ids: list[int]) -> list:
    """The tool calls a reply has finished writing so far (their `<|close|>call<|sep|>` generated)."""
    tools = split_reply(job.forced + ids, api.tokenizer, mode).tools
    return [c for c in parse_tool_calls(tools or "") if c.name and c.complete]


class ToolCallWatch:
    """The tool calls of a reply being streamed, each handed out once, as `_call_json` dicts: `token(id)` returns
    those finished since the last (looked for at each `<|sep|>`), `rest(message)` those of the whole reply not
    handed out yet (a call cut off by the token limit is never handed out)."""

    def __init__(self, api: Api, job: Job, mode: str):
        self.api, self.job, self.mode = api, job, mode
        self.ids, self.sent, self.sep = [], 0, api.tokenizer.id_of("<|sep|>")

    def token(self, token: int) -> list[dict]:
        self.ids.append(token)
        if token != self.sep:
            return []
        return self._hand_out([_call_json(c) for c in _complete_calls(self.api, self.job, self.mode, self.ids)])

    def rest(self, message: dict) -> list[dict]:
        return self._hand_out(message.get("tool_calls", []))

    def _hand_out(self, calls: list[dict]) -> list[dict]:
        new = calls[self.sent:]
        self.sent += len(new)
        return new


async def whole_reply(request, events: asyncio.Queue, job: Job, feed, result) -> JSONResponse:
    """A reply not streamed: every event of `job` through `feed` (the stream's builder, its events dropped), then
    `result()`; 499 when the client went away first."""
    async for event in events_or_cancel(request, events, job):
        if event[0] == "error":
            raise event[1]
        feed(event)
        if event[0] == "done":
            return JSONResponse(result())
    return JSONResponse({}, status_code=499)


async def events_or_cancel(request, events: asyncio.Queue, job: Job, idle: float | None = None):
    """A job's events as they come; the job is cancelled when the client disconnects or the stream is closed.
    With `idle`, None comes whenever that many seconds pass without an event (a stream's keep-alive)."""
    quiet = 0.0
    try:
        while True:
            try:
                event = await asyncio.wait_for(events.get(), timeout=0.5)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    return
                quiet += 0.5
                if idle is not None and quiet >= idle:
                    quiet = 0.0
                    yield None
                continue
            quiet = 0.0
            yield event
            if event[0] in ("done", "error"):
                return
    finally:
        job.cancelled.set()  # a no-op for a job that ended; frees the batch slot of one that did not


def internal_error(exc: Exception, where: str) -> ApiError:
    """An exception no check foresaw (a bug): its traceback to the log, and a 500 that names only its type."""
    log.error("%s failed: %s: %s", where, type(exc).__name__, exc, exc_info=exc)
    return ApiError(500, f"the server failed on this request ({type(exc).__name__}); its log has the details",
                    code="internal_error")


def guarded(handler, respond=error_response):
    """A route that answers an ApiError with `respond(err)` (this dialect's error body), any other exception with
    a 500 in that body (internal_error), and a client that left before its body was whole with 499 (one log
    line, serve/deadlines.py)."""
    async def route(request: Request):
        try:
            return await handler(request)
        except ApiError as err:
            return respond(err)
        except ClientDisconnect:
            return JSONResponse({}, status_code=499)
        except Exception as exc:
            return respond(internal_error(exc, f"{request.method} {request.url.path}"))
    route.__name__ = handler.__name__
    return route
