"""The routes of the three dialects on one engine, and the app `k3 serve` runs.

`api_router(worker, options)` returns a FastAPI APIRouter with one `Api` (serve/api.py: what the dialects share)
under OpenAI's chat completions (serve/chat_completions.py: /v1/chat/completions, /v1/completions, /v1/models,
/health), Anthropic's Messages (serve/anthropic.py) and OpenAI's Responses (serve/responses.py); `k3 ui`
includes it in its own app beside the page, so one engine serves both. `build_app(worker, options)` is the
FastAPI app `k3 serve` (and its --bench) serves: those routes, and OpenAI-shaped 404/405 for anything else.
"""
from __future__ import annotations

import fastapi
from fastapi import APIRouter
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from . import anthropic, chat_completions, responses
from .api import Api, ApiOptions
from .schema import ApiError
from .worker import Worker


def api_router(worker: Worker, opts: ApiOptions) -> APIRouter:
    api = Api(worker, opts)
    router = APIRouter()
    chat_completions.add_routes(router, api)
    anthropic.add_routes(router, api)  # the Messages and Responses APIs: the same Api, other dialects
    responses.add_routes(router, api)
    return router


def build_app(worker: Worker, api_options: ApiOptions) -> fastapi.FastAPI:
    """The FastAPI app `k3 serve` runs: the API routes, and OpenAI-shaped 404/405 for anything else."""
    app = fastapi.FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(api_router(worker, api_options))

    @app.exception_handler(HTTPException)
    async def http_error(request, exc):
        status = exc.status_code
        message = f"no route {request.method} {request.url.path}" if status in (404, 405) else str(exc.detail)
        return JSONResponse(ApiError(status, message, code="unknown_url" if status == 404 else None).body(),
                            status_code=status)

    return app
