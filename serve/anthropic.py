"""The Anthropic Messages API on `k3 serve`: POST /v1/messages (whole or streamed) and /v1/messages/count_tokens.

One engine, another dialect: the body (parsed by anthropic_schema.py into chat completions' ChatRequest) runs
as chat completions' Job on the same worker (batching, kept states, bounds); only the wire differs — content
blocks out, Anthropic's SSE events, `{"type": "error", "error": {type, message}}` errors with the HTTP status.
Checked by tests/serve/test_anthropic_api.py with the official `anthropic` package.
"""
from __future__ import annotations

import hmac
import json
import logging
import secrets

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from .anthropic_schema import IGNORED, TOOL_CHOICE_HEADER, messages_request, thinking_signature
from .api import (Api, ToolCallWatch, chat_job, chat_reply, events_or_cancel, guarded, internal_error, read_json,
                  whole_reply)
from .schema import ApiError

log = logging.getLogger("k3.serve")

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "request_too_large", 429: "overloaded_error", 500: "api_error",
               503: "overloaded_error"}
OVERLOADED = 529  # Anthropic's status for "try again later": the queue is full (429 in the OpenAI dialect)
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}  # else end_turn, or stop_sequence
BLOCKS = {"think": "thinking", "response": "text"}  # the XTML channel -> the content block it fills


# ---- the reply --------------------------------------------------------------------------------------------

def _event(name: str, **data) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data}, ensure_ascii=False)}\n\n".encode()


def _error(err: ApiError) -> dict:
    return {"type": ERROR_TYPES.get(err.status, "api_error"), "message": err.message}


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse({"type": "error", "error": _error(err)}, headers=err.headers,
                        status_code=OVERLOADED if err.status == 429 else err.status)


class Reply:
    """A message's content blocks, built from a job's events in the order they come. `feed` returns the
    SSE events each job event makes: the stream sends them, a whole reply drops them, so both are one reply."""

    def __init__(self, api: Api, job, mode: str, omit_thinking: bool = False):
        self.api, self.job, self.mode, self.omit_thinking = api, job, mode, omit_thinking
        self.content: list[dict] = []
        self.texts: dict[str, list[str]] = {}   # by channel, as chat completions' chat_reply reads them
        self.calls = ToolCallWatch(api, job, mode)  # a tool call becomes a block as soon as its element closes
        self.open: str | None = None            # the kind of the block still open (thinking, text)
        self.hidden = ""                        # the open thinking block's text, when the reply leaves it out
        self.stop_reason = self.stop_sequence = None
        self.usage: dict = {}

    def feed(self, event: tuple) -> list[bytes]:
        if event[0] == "token":
            return self._tool_uses(self.calls.token(event[1]))
        elif event[0] == "text" and event[1] in BLOCKS and event[2]:
            self.texts.setdefault(event[1], []).append(event[2])
            return self._text(BLOCKS[event[1]], event[2])
        elif event[0] == "done":
            return self._done(event[1], event[2])
        return []

    def message(self, head: dict) -> dict:
        return {**head, "content": self.content, "stop_reason": self.stop_reason,
                "stop_sequence": self.stop_sequence, "usage": self.usage}

    def _text(self, kind: str, text: str) -> list[bytes]:
        out = []
        if self.open != kind:
            out += self._close()
            self.content.append({"type": kind, kind: ""} | ({"signature": ""} if kind == "thinking" else {}))
            self.open = kind
            out.append(_event("content_block_start", index=len(self.content) - 1, content_block=self.content[-1]))
        if kind == "thinking" and self.omit_thinking:  # thought, not shown: the signature carries it at the close
            self.hidden += text
            return out
        self.content[-1][kind] += text
        out.append(_event("content_block_delta", index=len(self.content) - 1,
                          delta={"type": f"{kind}_delta", kind: text}))
        return out

    def _tool_uses(self, calls: list[dict]) -> list[bytes]:
        out = self._close() if calls else []
        for call in calls:
            fn, index = call["function"], len(self.content)
            block = {"type": "tool_use", "id": call["id"], "name": fn["name"], "input": {}}
            out.append(_event("content_block_start", index=index, content_block=block))
            out.append(_event("content_block_delta", index=index,
                              delta={"type": "input_json_delta", "partial_json": fn["arguments"]}))
            out.append(_event("content_block_stop", index=index))
            self.content.append({**block, "input": json.loads(fn["arguments"])})
        return out

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        out, index = [], len(self.content) - 1
        if self.open == "thinking" and self.omit_thinking:
            self.content[-1]["signature"] = signature = thinking_signature(self.hidden)
            self.hidden = ""
            out.append(_event("content_block_delta", index=index, delta={"type": "signature_delta",
                                                                         "signature": signature}))
        self.open = None
        return out + [_event("content_block_stop", index=index)]

    def _done(self, reason: str, stats: dict) -> list[bytes]:
        message, finish = chat_reply(self.api, self.job, self.mode, stats, reason, self.texts)
        out = self._tool_uses(self.calls.rest(message)) + self._close()
        matched = self.job.text.stops.stop if self.job.text is not None else None
        self.stop_reason = STOP_REASONS.get(finish) or ("stop_sequence" if matched is not None else "end_turn")
        self.stop_sequence = matched if self.stop_reason == "stop_sequence" else None
        self.usage = usage(stats)
        return out + [_event("message_delta", delta={"stop_reason": self.stop_reason,
                                                     "stop_sequence": self.stop_sequence}, usage=self.usage),
                      _event("message_stop")]


def usage(stats: dict) -> dict:
    """The Messages usage of a finished job: the prompt ids the prompt cache gave (cache_read), those it keeps now
    that it did not before (cache_creation), the rest (input_tokens), and the reply's."""
    read, created = stats["cached_tokens"], stats["stored_tokens"]
    return {"input_tokens": stats["prompt_tokens"] - read - created, "cache_creation_input_tokens": created,
            "cache_read_input_tokens": read, "output_tokens": stats["completion_tokens"]}


PING_SECONDS = 10.0  # while a long prompt is forwarded, a ping this often tells the client the stream is alive


async def _stream(request, events, job, reply: Reply, head: dict):
    yield _event("message_start", message={**head, "content": [], "stop_reason": None, "stop_sequence": None,
                                           "usage": {"input_tokens": len(job.prompt), "cache_creation_input_tokens": 0,
                                                     "cache_read_input_tokens": 0, "output_tokens": 0}})
    yield _event("ping")
    try:
        async for event in events_or_cancel(request, events, job, idle=PING_SECONDS):
            if event is None:
                yield _event("ping")
                continue
            if event[0] == "error":
                yield _event("error", error=_error(event[1]))
            for chunk in reply.feed(event):
                yield chunk
    except Exception as exc:  # a bug while making the stream: an error event, never a cut connection
        yield _event("error", error=_error(internal_error(exc, "POST /v1/messages")))


# ---- the routes ---------------------------------------------------------------------------------------------

def check_key(request, api_key: str | None) -> None:
    """With a key set, `x-api-key: KEY` or `Authorization: Bearer KEY` (compared in constant time)."""
    if api_key is None:
        return
    given = request.headers.get("x-api-key")
    if given is None:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        given = token.strip() if scheme.lower() == "bearer" else ""
    if not hmac.compare_digest(given.encode(), api_key.encode()):
        raise ApiError(401, "a valid API key is required: send `x-api-key: KEY` or `Authorization: Bearer KEY`",
                       code="invalid_api_key")


_logged: set[str] = set()


def log_ignored(name: str) -> None:
    """One log line per field k3 passes over, the first time a request sends it (docs/SERVER.md)."""
    if name not in _logged:
        _logged.add(name)
        log.info("/v1/messages: `%s` is accepted and not acted on: %s (logged once)", name, IGNORED[name])


def add_routes(router, api: Api) -> None:
    """POST /v1/messages and /v1/messages/count_tokens on `router`; the `anthropic-version` header is accepted,
    whatever it says."""

    async def parsed(request: Request, counting: bool = False):
        check_key(request, api.opts.api_key)
        read = messages_request(await read_json(request, api.opts.max_body_bytes), counting,
                                request.headers.get(TOOL_CHOICE_HEADER))
        api.check_model(read.request.model)
        for name in read.ignored:
            log_ignored(name)
        return read, *chat_job(api, read.request, read.places, counting)

    async def messages(request: Request):
        read, job, mode = await parsed(request)
        req = read.request
        events, reply = api.start(job), Reply(api, job, mode, read.omit_thinking)
        head = {"id": f"msg_{secrets.token_hex(12)}", "type": "message", "role": "assistant", "model": api.model_id}
        if req.stream:
            return StreamingResponse(_stream(request, events, job, reply, head), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await whole_reply(request, events, job, reply.feed, lambda: reply.message(head))

    async def count_tokens(request: Request):
        _, job, _ = await parsed(request, counting=True)  # a count, not a generation: no room for a reply needed
        return JSONResponse({"input_tokens": len(job.prompt)})

    router.add_api_route("/v1/messages", guarded(messages, error_response), methods=["POST"])
    router.add_api_route("/v1/messages/count_tokens", guarded(count_tokens, error_response), methods=["POST"])
