"""The OpenAI Responses API on `k3 serve`: POST /v1/responses (whole or streamed), with `previous_response_id`;
GET and DELETE /v1/responses/{response_id}.

One engine, another dialect: the body (parsed by responses_schema.py into chat completions' ChatRequest) runs as
chat completions' Job on the same worker (batching, kept states, bounds, log-probabilities); only the wire
differs — output items, typed SSE events, and a bounded store of recent responses and their conversations
(`MAX_STORED_RESPONSES`, oldest dropped; none with `store: false`) for follow-ups and retrieval. Errors are chat
completions' own. Checked by tests/serve/test_responses_api.py with the `openai` SDK.
"""
from __future__ import annotations

import copy
import itertools
import json
import secrets
import time
from collections import OrderedDict

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from k3core.generation.channels import Channels
from k3core.text.chat import tool_call_markup

from .api import (Api, ToolCallWatch, chat_job, chat_reply, check_key, events_or_cancel, guarded, internal_error,
                  read_json, whole_reply)
from .logprobs import chat_logprobs
from .responses_schema import Conversation, responses_request
from .schema import ApiError, _bad, _bool

MAX_STORED_RESPONSES = 64  # responses kept for previous_response_id and GET (docs/LIMITS.md); the oldest is dropped
OPEN = "<|open|>"


class Stored:
    """The last MAX_STORED_RESPONSES responses and their conversations, by response id (this process only)."""

    def __init__(self, limit: int = MAX_STORED_RESPONSES):
        self.limit, self.kept = limit, OrderedDict()  # id -> (the response object, its conversation)

    def conversation(self, rid) -> Conversation | None:
        """The conversation `previous_response_id` names (None when it names none); 400 when it is not kept."""
        if rid is None:
            return None
        if not isinstance(rid, str) or rid not in self.kept:
            raise _bad("previous_response_id", self._missing(rid))
        return self.kept[rid][1]

    def response(self, rid: str) -> dict:
        """The response object as its create call returned it; 404 when it is not kept."""
        if rid not in self.kept:
            raise ApiError(404, f"response_id: {self._missing(rid)}", param="response_id", code="not_found")
        return self.kept[rid][0]

    def delete(self, rid: str) -> None:
        self.response(rid)
        del self.kept[rid]

    def keep(self, response: dict, conversation: Conversation) -> None:
        self.kept[response["id"]] = (response, conversation)
        while len(self.kept) > self.limit:
            self.kept.popitem(last=False)

    def _missing(self, rid) -> str:
        return (f"no stored response {rid!r}: k3 keeps the last {self.limit} responses of this server process "
                "(MAX_STORED_RESPONSES) that were not created with `store: false` or deleted")


def _assistant(message: dict) -> dict:
    """chat completions' reply message as the k3 chat message that renders it again (so a follow-up reuses the
    kept state)."""
    out = {"role": "assistant", "content": message["content"]}
    if "reasoning_content" in message:
        out["thinking"] = message["reasoning_content"]
    if message.get("tool_calls"):
        out["tools"] = tool_call_markup([(c["function"]["name"], json.loads(c["function"]["arguments"]))
                                         for c in message["tool_calls"]])
    return out


class AnswerLogprobs:
    """The log-probabilities of the ids that make a reply's `response` text, as output_text `logprobs` entries:
    `add` takes every generated id's TokenLogprob in order, `take` hands out those not handed out yet (with the text
    they released). Markup and special ids, and the ids of the other channels (thinking, tool calls), make no
    output text and have none here; which they are is told by the same Channels the worker's TextStream uses."""

    def __init__(self, api: Api, job):
        self.tokenizer, self.special, self.pending = api.tokenizer, api.tokenizer.special_ids, []
        self.channels = Channels(api.tokenizer, job.channel)
        for token in job.forced:  # as the worker feeds them to its TextStream
            self.channels.is_markup(token)

    def add(self, entry) -> None:
        token = entry.token
        if not self.channels.is_markup(token) and token not in self.special and self.channels.current == "response":
            self.pending.append(entry)

    def take(self) -> list[dict]:
        out = chat_logprobs(self.tokenizer, self.pending)["content"]
        self.pending.clear()
        return out


class Output:
    """A response's output items, built from a job's events in the order they come. `feed` returns the typed
    stream events each job event makes (without sequence_number): the stream sends them, a whole response drops
    them, so both are one response. At the end the response and its conversation are kept (unless `store` is
    false) for `previous_response_id` and GET."""

    def __init__(self, api: Api, job, mode: str, head: dict, conversation: Conversation, stored: Stored):
        self.api, self.job, self.mode, self.head = api, job, mode, head
        self.conversation, self.stored = conversation, stored
        self.items: list[dict] = []
        self.texts: dict[str, list[str]] = {}   # by channel, as chat completions' chat_reply reads them
        self.calls = ToolCallWatch(api, job, mode)  # a tool call becomes an item as soon as its element closes
        self.logprobs = AnswerLogprobs(api, job)    # none come unless the job computes them
        self.open: str | None = None            # the channel of the item still open (think, response)
        self.status, self.incomplete, self.usage = "in_progress", None, None

    def response(self) -> dict:
        return {**self.head, "status": self.status, "incomplete_details": self.incomplete, "output": self.items,
                "usage": self.usage}

    def feed(self, event: tuple) -> list[dict]:
        if event[0] == "logprob":
            self.logprobs.add(event[1])
        elif event[0] == "token":
            return self._calls(self.calls.token(event[1]))
        elif event[0] == "text" and event[1] in ("think", "response") and event[2]:
            self.texts.setdefault(event[1], []).append(event[2])
            return self._text(event[1], event[2])
        elif event[0] == "done":
            return self._done(event[1], event[2])
        return []

    def _added(self, item: dict) -> dict:
        self.items.append(item)
        return {"type": "response.output_item.added", "output_index": len(self.items) - 1, "item": copy.deepcopy(item)}

    def _text(self, channel: str, text: str) -> list[dict]:
        out = []
        if self.open != channel:
            out += self._close()
            self.open = channel
            if channel == "think":
                out.append(self._added({"id": f"rs_{secrets.token_hex(12)}", "type": "reasoning", "summary": [],
                                        "content": []}))
            else:
                out.append(self._added({"id": f"msg_{secrets.token_hex(12)}", "type": "message", "role": "assistant",
                                        "status": "in_progress", "content": []}))
            part = {"type": "reasoning_text" if channel == "think" else "output_text", "text": ""}
            part |= {} if channel == "think" else {"annotations": [], "logprobs": []}
            self.items[-1]["content"].append(part)
            if channel == "response":
                out.append({**self._where(), "type": "response.content_part.added", "part": copy.deepcopy(part)})
        part = self.items[-1]["content"][0]
        part["text"] += text
        if channel == "think":
            return out + [{**self._where(), "type": "response.reasoning_text.delta", "delta": text}]
        logprobs = self.logprobs.take()
        part["logprobs"] += logprobs
        return out + [{**self._where(), "type": "response.output_text.delta", "delta": text, "logprobs": logprobs}]

    def _where(self) -> dict:
        return {"item_id": self.items[-1]["id"], "output_index": len(self.items) - 1, "content_index": 0}

    def _close(self, status: str = "completed") -> list[dict]:
        if self.open is None:
            return []
        item, part = self.items[-1], self.items[-1]["content"][0]
        if self.open == "think":
            out = [{**self._where(), "type": "response.reasoning_text.done", "text": part["text"]}]
        else:
            item["status"] = status
            out = [{**self._where(), "type": "response.output_text.done", "text": part["text"],
                    "logprobs": list(part["logprobs"])},
                   {**self._where(), "type": "response.content_part.done", "part": copy.deepcopy(part)}]
        self.open = None
        return out + [{"type": "response.output_item.done", "output_index": len(self.items) - 1,
                       "item": copy.deepcopy(item)}]

    def _calls(self, calls: list[dict]) -> list[dict]:
        out = self._close() if calls else []
        for call in calls:
            fn = call["function"]
            out.append(self._added({"id": f"fc_{secrets.token_hex(12)}", "type": "function_call", "call_id": call["id"],
                                    "name": fn["name"], "arguments": "", "status": "in_progress"}))
            item, where = self.items[-1], {"item_id": self.items[-1]["id"], "output_index": len(self.items) - 1}
            item.update(arguments=fn["arguments"], status="completed")
            out += [{**where, "type": "response.function_call_arguments.delta", "delta": fn["arguments"]},
                    {**where, "type": "response.function_call_arguments.done", "name": fn["name"],
                     "arguments": fn["arguments"]},
                    {"type": "response.output_item.done", "output_index": where["output_index"],
                     "item": copy.deepcopy(item)}]
        return out

    def _done(self, reason: str, stats: dict) -> list[dict]:
        message, finish = chat_reply(self.api, self.job, self.mode, stats, reason, self.texts)
        cut = finish == "length"
        out = self._close("incomplete" if cut else "completed")
        out += self._calls(self.calls.rest(message))
        self.status = "incomplete" if cut else "completed"
        self.incomplete = {"reason": "max_output_tokens"} if cut else None
        self.usage = _usage(stats, self._reasoning_tokens(stats["ids"]))
        if self.head["store"]:
            self._keep(message)
        return out + [{"type": f"response.{self.status}", "response": self.response()}]

    def _reasoning_tokens(self, ids: list[int]) -> int:
        """In thinking mode, the ids generated before the first channel after `think` opened (all, if none did)."""
        if self.mode != "thinking":
            return 0
        opened = self.api.tokenizer.id_of(OPEN)
        return ids.index(opened) if opened in ids else len(ids)

    def _keep(self, message: dict) -> None:
        names = self.conversation.names | {i["call_id"]: i["name"] for i in self.items if i["type"] == "function_call"}
        messages = self.conversation.messages + (_assistant(message),)
        self.stored.keep(self.response(), Conversation(messages, ("previous_response_id",) * len(messages), names))


def _usage(stats: dict, reasoning: int) -> dict:
    return {"input_tokens": stats["prompt_tokens"], "input_tokens_details": {"cached_tokens": stats["cached_tokens"]},
            "output_tokens": stats["completion_tokens"], "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": stats["prompt_tokens"] + stats["completion_tokens"]}


def _head(api: Api, body: dict, job) -> dict:
    """The response's fields that echo the request."""
    reasoning = body.get("reasoning") or {}
    return {"id": f"resp_{secrets.token_hex(12)}", "object": "response", "created_at": int(time.time()),
            "model": api.model_id, "error": None, "instructions": body.get("instructions"),
            "previous_response_id": body.get("previous_response_id"), "tools": body.get("tools") or [],
            "tool_choice": body.get("tool_choice") or "auto",
            "parallel_tool_calls": _bool(body, "parallel_tool_calls", True),
            "temperature": job.params.temperature, "top_p": job.params.top_p,
            "max_output_tokens": job.params.max_tokens, "reasoning": {"effort": reasoning.get("effort")},
            "text": {"format": (body.get("text") or {}).get("format") or {"type": "text"}},
            "metadata": body.get("metadata") or {},
            "top_logprobs": body.get("top_logprobs"), "store": _bool(body, "store", True)}


async def _stream(request, events, job, output: Output):
    numbers = itertools.count()

    def frame(event: dict) -> bytes:
        event = {**event, "sequence_number": next(numbers)}
        return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n".encode()

    yield frame({"type": "response.created", "response": output.response()})
    yield frame({"type": "response.in_progress", "response": output.response()})
    def error(err: ApiError) -> bytes:
        return frame({"type": "error", "code": err.code, "message": err.message, "param": err.param})

    try:
        async for event in events_or_cancel(request, events, job):
            if event[0] == "error":
                yield error(event[1])
            for e in output.feed(event):
                yield frame(e)
    except Exception as exc:  # a bug while making the stream: an error event, never a cut connection
        yield error(internal_error(exc, "POST /v1/responses"))


def add_routes(router, api: Api) -> None:
    """POST /v1/responses and GET and DELETE /v1/responses/{response_id} on `router`, with their own store of
    recent responses."""
    stored = Stored()

    async def responses(request: Request):
        check_key(request, api.opts)
        body = await read_json(request, api.opts.max_body_bytes)
        previous = stored.conversation(body.get("previous_response_id")) if isinstance(body, dict) else None
        req, conversation = responses_request(body, api.engine.max_context, previous)
        api.check_model(req.model)
        job, mode = chat_job(api, req, list(conversation.places))
        output = Output(api, job, mode, _head(api, body, job), conversation, stored)
        events = api.start(job)
        if req.stream:
            return StreamingResponse(_stream(request, events, job, output), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await whole_reply(request, events, job, output.feed, output.response)

    async def retrieve(request: Request):
        check_key(request, api.opts)
        if request.query_params.get("stream", "false") != "false":
            raise _bad("stream", "a stored response is not streamed again: GET returns it whole")
        return JSONResponse(stored.response(request.path_params["response_id"]))

    async def delete(request: Request):
        check_key(request, api.opts)
        rid = request.path_params["response_id"]
        stored.delete(rid)
        return JSONResponse({"id": rid, "object": "response", "deleted": True})

    router.add_api_route("/v1/responses", guarded(responses), methods=["POST"])
    router.add_api_route("/v1/responses/{response_id}", guarded(retrieve), methods=["GET"])
    router.add_api_route("/v1/responses/{response_id}", guarded(delete), methods=["DELETE"])
