"""The routes of the three dialects on one engine, and the app `k3 serve` runs.

`api_router(worker, options)` returns a FastAPI APIRouter with one `Api` (serve/api.py: what the dialects share)
under OpenAI's chat completions (serve/chat_completions.py: /v1/chat/completions, /v1/completions, /v1/models,
/health), Anthropic's Messages (serve/anthropic.py), OpenAI's Responses (serve/responses.py) and the tokenizer
(serve/tokenize.py: /tokenize, /detokenize, /tokenizer_info, as vLLM serves them); `k3 ui`
includes it in its own app beside the page, so one engine serves both. `build_app(worker, options)` is the
FastAPI app `k3 serve` (and its --bench) serves: those routes, and `route_error` for anything else — 404 for a
path no route serves, 405 with `Allow` for a method its route does not take — in the dialect the path speaks.
"""
from __future__ import annotations

import fastapi
from fastapi import APIRouter
from starlette.exceptions import HTTPException
from starlette.routing import Match

from . import anthropic, chat_completions, responses, tokenize
from .api import Api, ApiOptions, error_response
from .schema import ApiError
from .worker import Worker

ANTHROPIC_PATH = "/v1/messages"  # it and the paths under it speak Anthropic's dialect, errors included


def api_router(worker: Worker, opts: ApiOptions) -> APIRouter:
    api = Api(worker, opts)
    router = APIRouter()
    chat_completions.add_routes(router, api)
    anthropic.add_routes(router, api)  # the Messages and Responses APIs: the same Api, other dialects
    responses.add_routes(router, api)
    tokenize.add_routes(router, api)
    return router


METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def allowed_methods(request) -> list[str]:
    """The methods some route of the app takes at the request's path: several routes may share a path, as GET and
    DELETE /v1/responses/{response_id} do, and Starlette's own 405 names only the first one's."""
    return [m for m in METHODS if any(route.matches({**request.scope, "method": m})[0] == Match.FULL
                                      for route in request.app.router.routes)]


def route_error(request, exc: HTTPException):
    """An HTTPException the routing raised (no route at the path: 404; a route that takes other methods: 405, with
    `Allow`), or any other, as an ApiError in the path's dialect: Anthropic's error body under /v1/messages, OpenAI's
    elsewhere; its type `invalid_request_error` for 405, as both APIs answer."""
    status, method, path = exc.status_code, request.method, request.url.path
    headers = dict(exc.headers or {})
    if status == 405:
        allow = allowed_methods(request) or [m.strip() for m in headers.get("Allow", "").split(",") if m.strip()]
        headers["Allow"] = ", ".join(allow)
        message = f"{method} {path}: method not allowed; this route takes {' or '.join(allow)}"
    elif status == 404:
        message = f"no route {method} {path}"
    else:
        message = str(exc.detail)
    err = ApiError(status, message, code="unknown_url" if status == 404 else None, headers=headers)
    anthropic_path = path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")
    return anthropic.error_response(err) if anthropic_path else error_response(err)


def build_app(worker: Worker, api_options: ApiOptions) -> fastapi.FastAPI:
    """The FastAPI app `k3 serve` runs: the API routes, and `route_error` for anything else."""
    return app_of(api_router(worker, api_options))


def app_of(router: APIRouter) -> fastapi.FastAPI:
    """An app of `router`'s routes that answers as `k3 serve` does: `route_error` for a path no route serves (404)
    and a method its route does not take (405 with `Allow`), in the path's dialect. k3 ui serves its /v1 with it."""
    app = fastapi.FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(router)

    @app.exception_handler(HTTPException)
    async def http_error(request, exc):
        return route_error(request, exc)

    return app
