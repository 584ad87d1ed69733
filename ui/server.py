"""Where `k3 ui` listens and who may use it. Loopback (127.0.0.1) by default; any other address only
with --host AND --i-know-this-exposes-the-model, and then with a printed warning; --auth (or
K3_UI_AUTH) adds a login whose password is never printed; never a public share link. With a login, /v1 asks
for a credential too (`api_credential`): the API key when one is set, else the login's password, sent as
`Authorization: Bearer PASSWORD` (or `x-api-key: PASSWORD` on /v1/messages); without it, 401 in the dialect's shape.

The page is served by our own FastAPI app (Gradio mounted at /) under uvicorn, so that every browser
gets a server-issued, unguessable session cookie (ui/session.py): a conversation belongs to the cookie that
started it (and the tab), never to an id a client chooses. This module assembles: it builds the page
(ui/app.py) and the OpenAI routes (serve/app.py) over one engine and serves them, /v1 answered as `k3 serve`
answers it (errors included: serve.app's `app_of`). Checked by tests/ui/test_server.py and tests/ui/test_app.py.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from k3core import EngineConfig
from k3core.errors import UsageError
from k3core.report.run import rss_bytes

from serve.http import Listening, Timeouts, is_loopback, listen
from serve.http import api_key as read_api_key
from serve.http import check_host as check_listening_host

from .guard import Guard
from .host import EngineHost
from .session import session_cookie_middleware

EXPOSE_FLAG = "--i-know-this-exposes-the-model"
log = logging.getLogger("k3.ui")


@dataclass(frozen=True)
class ServerOptions:
    """How `k3 ui` serves (its flags, beside the engine's EngineConfig)."""

    host: str | None = None      # None: 127.0.0.1
    port: int = 7860
    expose: bool = False         # allow a non-loopback host
    auth: str | None = None      # USER:PASSWORD, else K3_UI_AUTH
    queue_size: int = 16         # requests that may wait for the engine
    keep_states: int = 2         # browser sessions whose decode state stays in memory
    access_log: bool = False     # log every HTTP request (uvicorn's access log)
    allow_admin: bool = False    # clients may run Setup, open another model, change budgets (also with auth)
    models_root: str | None = None  # where Setup may write; None: the current directory
    api_key: str | None = None   # the OpenAI API under /v1 asks for it (else K3_API_KEY); off-loopback it is required
    timeouts: Timeouts = Timeouts()  # for a request's headers, then its body (every route: the page's and /v1)


def check_host(host: str | None, expose: bool) -> str:
    """The address to bind, by serve/http.py's one host policy with `k3 ui`'s guard: loopback, or another
    address when exposing it was asked for explicitly (EXPOSE_FLAG)."""
    return check_listening_host(host, expose, EXPOSE_FLAG,
                                f"Add {EXPOSE_FLAG} if you mean it (and --auth USER:PASSWORD)")


def parse_auth(text: str | None) -> tuple[str, str] | None:
    if not text:
        return None
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise UsageError("--auth takes USER:PASSWORD (both non-empty); K3_UI_AUTH takes the same")
    return user, password


def api_credential(key: str | None, auth: tuple[str, str] | None) -> str | None:
    """What /v1 asks its clients for: the API key (--api-key, K3_API_KEY) when one is set, else, with a login,
    the login's password (a page behind a login never serves its engine to whoever asks); None: nothing."""
    if key is not None:
        return key
    return auth[1] if auth else None


def launch(demo, host: str, port: int, auth: tuple[str, str] | None = None, block: bool = True,
           quiet: bool = False, access_log: bool = False, api=None, timeouts: Timeouts = Timeouts()) -> Listening:
    """Serve the app on host:port (already checked), with `api` (an APIRouter: the OpenAI routes, served by
    serve.app's `app_of` under /v1) beside the page when given, clients held to `timeouts`. Returns when it listens
    (block=False) or when it stops."""
    import fastapi
    import gradio as gr

    from serve.app import app_of

    app = fastapi.FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    session_cookie_middleware(app)
    gr.mount_gradio_app(app, demo, path="/", auth=auth, server_name=host, server_port=port, show_error=True,
                        ssr_mode=False, mcp_server=False, enable_monitoring=False, footer_links=["api", "settings"],
                        **_look())
    listening = listen(app if api is None else beside(app, app_of(api), api), host, port, access_log, timeouts)
    url = listening.url = listening.url + "/"
    log.info("listening on %s%s", url, " with a login" if auth else "")
    if not quiet:
        print(f"k3 ui: open {url}" + (f" (log in as {auth[0]})" if auth else "") + " — Ctrl-C to stop", flush=True)
        if api is not None:
            print(f"k3 ui: the OpenAI API is at {url}v1 too (docs/SERVER.md)", flush=True)
    if block:
        try:
            while listening.thread.is_alive():
                listening.thread.join(0.5)
        except KeyboardInterrupt:
            listening.close()
            raise
    return listening


def beside(page, api, router):
    """One ASGI app: /v1 and everything under it, and any other path a route of `router` takes (/health), go to
    `api`; the rest (and the lifespan events, which start Gradio's queue) to `page`."""
    paths = {route.path for route in router.routes}

    def for_api(path: str) -> bool:
        return path == "/v1" or path.startswith("/v1/") or path in paths

    async def app(scope, receive, send):
        target = api if scope["type"] in ("http", "websocket") and for_api(scope.get("path", "")) else page
        await target(scope, receive, send)

    return app


def _look() -> dict:
    from .app import CSS, theme

    return {"theme": theme(), "css": CSS}


def warn_exposed(host: str, auth) -> None:
    print(f"k3 ui: WARNING: listening on {host}, not just this machine: whoever reaches this address can use the "
          "model" + ("" if auth else " WITHOUT a password (add --auth USER:PASSWORD)")
          + "; traffic is plain HTTP", file=sys.stderr)


def openai_routes(host: EngineHost, opts: ServerOptions, key: str | None):
    """The `k3 serve` routes over this page's engine: its requests take the same engine lock as the page's
    turns, between passes, and share the page's prompt cache. Returns (the worker, the APIRouter)."""
    from serve.api import ApiOptions
    from serve.app import api_router
    from serve.worker import Worker

    worker = Worker(host, queue_size=opts.queue_size, speculation=host.speculation)
    return worker, api_router(worker, ApiOptions(api_key=key, created=int(time.time())))


def serve(config: EngineConfig, opts: ServerOptions, speculation=lambda: None,
          prompt_cache=lambda engine, tokenizer: None) -> int:
    """`k3 ui`: check the address first, then open the engine, build the app and serve until Ctrl-C.
    `prompt_cache(engine, tokenizer)`: the PrefixCache the page's sessions and /v1 share, or None."""
    host = check_host(opts.host, opts.expose)
    auth = parse_auth(opts.auth or os.environ.get("K3_UI_AUTH"))
    if not is_loopback(host):
        warn_exposed(host, auth)
    key = read_api_key(opts.api_key)
    # no model, no profile, a plan that does not fit: said before Gradio loads
    engine = EngineHost(config, speculation, prompt_cache)
    for notice in engine.engine.notices:
        print(notice, file=sys.stderr)
    worker, before_page = None, rss_bytes()
    try:
        os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
        from .app import build

        guard = Guard(admin=opts.allow_admin or auth is not None, models_root=Path(opts.models_root or os.getcwd()))
        demo = build(engine, keep_states=opts.keep_states, guard=guard).demo.queue(
            max_size=opts.queue_size, default_concurrency_limit=None)
        print(f"k3 ui: model {engine.model}", flush=True)
        log.info("serving %s (kernels %s, trunk placer %s, expert store %s)", engine.model,
                 engine.engine.kernels.name, engine.engine.placer.name, engine.engine.store.name)
        api = None
        if is_loopback(host) or key is not None:
            worker, api = openai_routes(engine, opts, api_credential(key, auth))
            if key is None and auth is not None:
                print("k3 ui: /v1 asks for the login's password as its API key: send `Authorization: Bearer "
                      "PASSWORD` (or `x-api-key: PASSWORD` on /v1/messages)", flush=True)
        else:
            print("k3 ui: the OpenAI API (/v1) is off: on a non-loopback address it needs an API key (K3_API_KEY)",
                  file=sys.stderr)
        engine.rss_outside_engine += rss_bytes() - before_page  # Gradio and the page, loaded after the engine
        launch(demo, host, opts.port, auth, block=True, access_log=opts.access_log, api=api, timeouts=opts.timeouts)
    finally:
        if worker is not None:
            worker.close()
        engine.close()
    return 0
