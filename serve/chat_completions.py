"""OpenAI's chat completions on `k3 serve` (and `k3 ui`'s /v1): POST /v1/chat/completions and the legacy
POST /v1/completions (whole or streamed; several prompts, a choice each, whole only), and the routes every client
starts with: GET /v1/models, /v1/models/{model} and /health. Every error here is OpenAI-shaped with its HTTP
status. Checked by tests/serve/test_openai_api.py with the `openai` package (several prompts and max_tokens 0:
tests/serve/test_lm_eval_api.py).
"""
from __future__ import annotations

import asyncio
import json
import secrets
import time

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from .api import (FINISH, Api, ToolCallWatch, chat_reply, check_key, events_or_cancel, guarded, internal_error,
                  read_json)
from .logprobs import LegacyLogprobs, chat_logprobs
from .schema import ChatRequest, CompletionRequest, chat_request, completion_request
from .worker import Job


def _usage(*stats: dict) -> dict:
    """`usage` of one job's done stats, or of several summed (the prompts of one completions request)."""
    prompt, completion, cached = (sum(s[k] for s in stats) for k in ("prompt_tokens", "completion_tokens",
                                                                      "cached_tokens"))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


async def _collect(request, events: asyncio.Queue, job: Job):
    """Wait for a job's end (cancelled if the client goes away): (texts by channel, reason, stats), or None
    when the client went away first."""
    texts: dict[str | None, list[str]] = {}
    async for event in events_or_cancel(request, events, job):
        if event[0] == "text":
            texts.setdefault(event[1], []).append(event[2])
        elif event[0] == "done":
            return texts, event[1], event[2]
        elif event[0] == "error":
            raise event[1]
    return None


async def _collect_all(api: Api, request, jobs: list[Job]):
    """Every job's `_collect`, in order, or None when the client went away first. At most `engine.sequences` of
    them are in the worker at once, so one request's prompts never fill its queue alone; the first error ends
    the others (each reply is the bits it gets alone, batched or not)."""
    gate = asyncio.Semaphore(max(1, api.engine.sequences))

    async def one(job: Job):
        async with gate:
            return await _collect(request, api.start(job), job)

    tasks = [asyncio.ensure_future(one(job)) for job in jobs]
    try:
        done = await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:  # a no-op for those that ended; the others' jobs are cancelled
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # every error retrieved, every job let go
        raise
    return None if None in done else done


def _sse(payload) -> bytes:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()


def add_routes(router, api: Api) -> None:
    """GET /health, /v1/models and /v1/models/{model}; POST /v1/chat/completions and /v1/completions on `router`."""
    worker, opts = api.worker, api.opts

    async def health(request: Request):
        return JSONResponse({"status": "ok", "model": api.model_id, **worker.stats()})

    async def models(request: Request):
        check_key(request, opts)
        return JSONResponse({"object": "list", "data": [api.model_card()]})

    async def model(request: Request):
        check_key(request, opts)
        api.check_model(request.path_params["model"])
        return JSONResponse(api.model_card())

    async def chat(request: Request):
        check_key(request, opts)
        req = chat_request(await read_json(request, opts.max_body_bytes), api.engine.max_context)
        api.check_model(req.model)
        job, mode = api.chat_job(req)
        events = api.start(job)
        rid, created = f"chatcmpl-{secrets.token_hex(12)}", int(time.time())
        head = {"id": rid, "created": created, "model": api.model_id}
        if req.stream:
            return StreamingResponse(_chat_stream(api, request, events, job, mode, head, req),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        got = await _collect(request, events, job)
        if got is None:
            return JSONResponse({}, status_code=499)
        texts, reason, stats = got
        message, finish = chat_reply(api, job, mode, stats, reason, texts)
        logprobs = chat_logprobs(api.tokenizer, stats["logprobs"]) if req.logprobs is not None else None
        return JSONResponse({**head, "object": "chat.completion", "usage": _usage(stats),
                             "choices": [{"index": 0, "message": message, "finish_reason": finish,
                                          "logprobs": logprobs}]})

    async def completions(request: Request):
        check_key(request, opts)
        req = completion_request(await read_json(request, opts.max_body_bytes), api.engine.max_context)
        api.check_model(req.model)
        jobs = api.completion_jobs(req)
        head = {"id": f"cmpl-{secrets.token_hex(12)}", "created": int(time.time()), "model": api.model_id}
        if req.stream:  # one prompt: completion_request refuses a stream of several
            return StreamingResponse(_completion_stream(api, request, api.start(jobs[0]), jobs[0], head, req),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        done = await _collect_all(api, request, jobs)
        if done is None:
            return JSONResponse({}, status_code=499)
        return JSONResponse({**head, "object": "text_completion", "usage": _usage(*(stats for _, _, stats in done)),
                             "choices": [_completion_choice(api, req, i, job, *got)
                                         for i, (job, got) in enumerate(zip(jobs, done))]})

    router.add_api_route("/health", guarded(health), methods=["GET"])
    router.add_api_route("/v1/models", guarded(models), methods=["GET"])
    router.add_api_route("/v1/models/{model}", guarded(model), methods=["GET"])
    router.add_api_route("/v1/chat/completions", guarded(chat), methods=["POST"])
    router.add_api_route("/v1/completions", guarded(completions), methods=["POST"])


def _completion_choice(api: Api, req: CompletionRequest, index: int, job: Job, texts: dict, reason: str,
                       stats: dict) -> dict:
    """Choice `index` of a whole completion: prompt `index`'s text when echoed, then its reply's."""
    text = (api.prompt_text(req.prompts[index]) if req.echo else "") + "".join(texts.get(None, []))
    return {"index": index, "text": text, "finish_reason": FINISH[reason],
            "logprobs": _legacy_logprobs(api, job, stats)}


def _legacy_logprobs(api: Api, job: Job, stats: dict) -> dict | None:
    """A whole completion's legacy `logprobs`: the prompt's ids first when they were scored (echo)."""
    if job.logprobs is None:
        return None
    scores, ids = stats["logprobs"], stats["ids"]
    if stats["prompt_logprobs"] is not None:
        scores, ids = stats["prompt_logprobs"] + scores, job.prompt + ids
    return LegacyLogprobs(api.tokenizer).of(ids, scores)


async def _chat_stream(api: Api, request, events, job: Job, mode: str, head: dict, req: ChatRequest):
    include_usage, scores = req.include_usage, []  # the logprobs of the ids since the last chunk

    def chunk(delta: dict, finish=None, usage=None) -> bytes:
        logprobs = chat_logprobs(api.tokenizer, scores) if scores else None
        scores.clear()
        body = {**head, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}]}
        if include_usage:
            body["usage"] = usage
        return _sse(body)

    yield chunk({"role": "assistant", "content": ""})
    texts: dict[str | None, list[str]] = {}
    calls = ToolCallWatch(api, job, mode)  # each tool call goes out once its element closes
    try:
        async for event in events_or_cancel(request, events, job):
            kind = event[0]
            if kind == "logprob":
                scores.append(event[1])
            elif kind == "token":
                first = calls.sent
                if new := calls.token(event[1]):
                    yield chunk({"tool_calls": [{"index": first + i, **call} for i, call in enumerate(new)]})
            elif kind == "text" and event[1] in ("think", "response"):
                texts.setdefault(event[1], []).append(event[2])
                yield chunk({"reasoning_content": event[2]} if event[1] == "think" else {"content": event[2]})
            elif kind == "done":
                message, finish = chat_reply(api, job, mode, event[2], event[1], texts)
                first = calls.sent
                if rest := calls.rest(message):
                    yield chunk({"tool_calls": [{"index": first + i, **call} for i, call in enumerate(rest)]})
                yield chunk({}, finish)  # with the logprobs of ids that made no text (a stop id)
                if include_usage:
                    yield _sse({**head, "object": "chat.completion.chunk", "choices": [], "usage": _usage(event[2])})
                yield b"data: [DONE]\n\n"
            elif kind == "error":
                yield _sse(event[1].body())
                yield b"data: [DONE]\n\n"
    except Exception as exc:  # a bug while making the stream: an error event, never a cut connection
        yield _sse(internal_error(exc, "POST /v1/chat/completions").body())
        yield b"data: [DONE]\n\n"


async def _completion_stream(api: Api, request, events, job: Job, head: dict, req: CompletionRequest):
    legacy, scores = LegacyLogprobs(api.tokenizer), []  # the logprobs of the ids since the last chunk

    def chunk(text: str, finish=None, ids=None, entries=None) -> bytes:
        if ids is None:
            ids, entries = [e.token for e in scores], list(scores)
            scores.clear()
        logprobs = legacy.of(ids, entries) if req.logprobs is not None else None
        body = {**head, "object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish,
                                                                  "logprobs": logprobs}]}
        if req.include_usage:
            body["usage"] = None
        return _sse(body)

    if req.echo and not job.score_prompt:
        yield chunk(api.prompt_text(req.prompts[0]))
    try:
        async for event in events_or_cancel(request, events, job):
            if event[0] == "prompt_logprobs":  # echo with logprobs: the prompt goes out with its scores
                yield chunk(api.prompt_text(req.prompts[0]), ids=job.prompt, entries=event[1])
            elif event[0] == "logprob":
                scores.append(event[1])
            elif event[0] == "text":
                yield chunk(event[2])
            elif event[0] == "done":
                yield chunk("", FINISH[event[1]])
                if req.include_usage:
                    yield _sse({**head, "object": "text_completion", "choices": [], "usage": _usage(event[2])})
                yield b"data: [DONE]\n\n"
            elif event[0] == "error":
                yield _sse(event[1].body())
                yield b"data: [DONE]\n\n"
    except Exception as exc:  # a bug while making the stream: an error event, never a cut connection
        yield _sse(internal_error(exc, "POST /v1/completions").body())
        yield b"data: [DONE]\n\n"
