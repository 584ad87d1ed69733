"""The model's tokenizer over HTTP, at the root as vLLM serves it: POST /tokenize, POST /detokenize and
GET /tokenizer_info — the routes lm-eval's `tokenizer_backend=remote` (and its auto-detection) asks for — and
llama.cpp's shapes of the first two. The ids are those the generating routes forward: a `prompt` (or llama.cpp's
`content`) is encoded as /v1/completions encodes it (text that spells a special token stays text; k3 adds no BOS,
so `add_special_tokens` changes nothing), `messages` become the prompt /v1/chat/completions would forward. A text
or a list of ids longer than the context (--max-context) is a 400 naming the field. Checked by
tests/serve/test_lm_eval_api.py.
"""
from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse
from k3core.errors import InputError

from .api import Api, check_key, guarded, read_json
from .logprobs import piece
from .schema import ApiError, _bad, _bool, chat_request

TEXTS = ("prompt", "content", "messages")  # what /tokenize encodes: vLLM's text, llama.cpp's text, vLLM's chat
CHAT_DEFAULTS = {"add_generation_prompt": True, "continue_final_message": False, "chat_template": None,
                 "chat_template_kwargs": None}  # vLLM's chat fields: only what /v1/chat/completions renders is served


def _object(body) -> dict:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    return body


def _check_model(api: Api, body: dict) -> None:
    """`model` is optional here (vLLM's tokenizer routes take it so); when given it must name the served model."""
    model = body.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise _bad("model", f"must be a string, got {type(model).__name__}")
        api.check_model(model)


def _within_context(api: Api, field: str, count: int, what: str) -> None:
    if count > api.engine.max_context:
        raise ApiError(400, f"{field}: {what} {count} ids, over the context limit of {api.engine.max_context} "
                       "(--max-context)", param=field, code="context_length_exceeded")


def _chat_ids(api: Api, body: dict) -> list[int]:
    """The prompt /v1/chat/completions forwards for this body's `messages` (`tools`, `tool_choice` and thinking
    read as it reads them), generation prefix included: vLLM's chat fields that would render anything else are
    refused by name."""
    for name, served in CHAT_DEFAULTS.items():
        if body.get(name, served) != served:
            raise _bad(name, f"not served: the prompt is the one /v1/chat/completions renders ({name} "
                       f"{'absent' if served is None else str(served).lower()}), got {body[name]!r}")
    req = chat_request({**body, "model": body.get("model") or api.model_id}, api.engine.max_context)
    return api.chat_job(req, counting=True)[0].prompt


def tokenize(api: Api, body: dict) -> dict:
    """POST /tokenize: vLLM's answer {count, max_model_len, tokens, token_strs} to `prompt` or `messages`,
    llama.cpp's {tokens} to `content` (with `with_pieces`, each {id, piece}: its text, or its bytes when they
    are not UTF-8 alone)."""
    given = [name for name in TEXTS if body.get(name) is not None]
    if len(given) != 1:
        raise _bad("prompt", "give one of `prompt` (text), `content` (llama.cpp's name for it) or `messages` (a chat)"
                   + (f", not {' and '.join(given)}" if given else ""))
    field = given[0]
    for flag in ("add_special_tokens", "add_special", "return_token_strs", "with_pieces"):
        _bool(body, flag)
    if field == "messages":
        ids = _chat_ids(api, body)
    elif isinstance(body[field], str):
        ids = api.tokenizer.encode(body[field])
    else:
        raise _bad(field, f"must be a string, got {type(body[field]).__name__}")
    _within_context(api, field, len(ids), "encodes to")
    if field == "content":
        return {"tokens": [_with_piece(api, t) for t in ids] if _bool(body, "with_pieces") else ids}
    strs = [piece(api.tokenizer, t)[0] for t in ids] if _bool(body, "return_token_strs") else None
    return {"count": len(ids), "max_model_len": api.engine.max_context, "tokens": ids, "token_strs": strs}


def _with_piece(api: Api, token: int) -> dict:
    raw = api.tokenizer.token_bytes(token)
    try:
        return {"id": token, "piece": raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {"id": token, "piece": list(raw)}


def detokenize(api: Api, body: dict) -> dict:
    """POST /detokenize: the text of `tokens`, under vLLM's name (`prompt`) and llama.cpp's (`content`), since
    both ask with the same body."""
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise _bad("tokens", "must be a list of token ids")
    _within_context(api, "tokens", len(tokens), "holds")
    try:
        text = api.tokenizer.decode(tokens)
    except InputError as exc:
        raise _bad("tokens", str(exc)) from None
    return {"prompt": text, "content": text}


def tokenizer_info(api: Api) -> dict:
    """GET /tokenizer_info: as vLLM answers it, the checkpoint's tokenizer_config.json (`eos_token`,
    `bos_token`, `chat_template`, …) with `tokenizer_class` always present (else the class k3 encodes with)."""
    config = api.tokenizer.config
    return {**config, "tokenizer_class": config.get("tokenizer_class") or type(api.tokenizer).__name__}


def add_routes(router, api: Api) -> None:
    """POST /tokenize and /detokenize, GET /tokenizer_info on `router`; with an API key each asks for it."""

    async def read(request: Request) -> dict:
        check_key(request, api.opts)
        body = _object(await read_json(request, api.opts.max_body_bytes))
        _check_model(api, body)
        return body

    async def tokenize_route(request: Request):
        return JSONResponse(tokenize(api, await read(request)))

    async def detokenize_route(request: Request):
        return JSONResponse(detokenize(api, await read(request)))

    async def tokenizer_info_route(request: Request):
        check_key(request, api.opts)
        return JSONResponse(tokenizer_info(api))

    router.add_api_route("/tokenize", guarded(tokenize_route), methods=["POST"])
    router.add_api_route("/detokenize", guarded(detokenize_route), methods=["POST"])
    router.add_api_route("/tokenizer_info", guarded(tokenizer_info_route), methods=["GET"])
