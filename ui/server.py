"""Where `k3 ui` listens and who may use it. Loopback (127.0.0.1) by default; any other address only
with --host AND --i-know-this-exposes-the-model, and then with a printed warning; --auth (or
K3_UI_AUTH) adds a login whose password is never printed; never a public share link.
Checked by tests/ui/test_server.py.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import sys
from dataclasses import dataclass

from k3core import EngineConfig, UsageError

from .host import EngineHost

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


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


def check_host(host: str | None, expose: bool) -> str:
    """The address to bind: loopback unless exposing was asked for explicitly."""
    host = host or "127.0.0.1"
    if is_loopback(host):
        return host
    if not expose:
        raise UsageError(f"refusing to listen on {host}: anyone who can reach it could use the model and this "
                         f"machine. Add {EXPOSE_FLAG} if you mean it (and --auth USER:PASSWORD); the default is "
                         "127.0.0.1, this machine only")
    return host


def parse_auth(text: str | None) -> tuple[str, str] | None:
    if not text:
        return None
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise UsageError("--auth takes USER:PASSWORD (both non-empty); K3_UI_AUTH takes the same")
    return user, password


def launch(demo, host: str, port: int, auth: tuple[str, str] | None = None, block: bool = True,
           quiet: bool = False, access_log: bool = False):
    """Start the app on host:port (already checked). Returns the local URL; blocks unless `block` is False."""
    demo.launch(server_name=host, server_port=port, share=False, auth=auth, prevent_thread_lock=True,
                quiet=True, show_error=True, ssr_mode=False, mcp_server=False, enable_monitoring=False, **_look())
    if access_log:  # uvicorn configured its loggers at WARNING while starting: one line per request from now on
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/"
    log.info("listening on %s%s", url, " with a login" if auth else "")
    if not quiet:
        print(f"k3 ui: open {url}" + (f" (log in as {auth[0]})" if auth else "") + " — Ctrl-C to stop", flush=True)
    if block:
        demo.block_thread()
    return url


def _look() -> dict:
    from .app import CSS, theme

    return {"theme": theme(), "css": CSS}


def warn_exposed(host: str, auth) -> None:
    print(f"k3 ui: WARNING: listening on {host}, not just this machine: whoever reaches this address can use the "
          "model" + ("" if auth else " WITHOUT a password (add --auth USER:PASSWORD)")
          + "; traffic is plain HTTP", file=sys.stderr)


def serve(config: EngineConfig, opts: ServerOptions) -> int:
    """`k3 ui`: check the address first, then open the engine, build the app and serve until Ctrl-C."""
    host = check_host(opts.host, opts.expose)
    auth = parse_auth(opts.auth or os.environ.get("K3_UI_AUTH"))
    if not is_loopback(host):
        warn_exposed(host, auth)
    engine = EngineHost(config)  # no model, no profile, a plan that does not fit: said before Gradio loads
    for notice in engine.engine.notices:
        print(notice, file=sys.stderr)
    try:
        os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
        from .app import build

        demo = build(engine, keep_states=opts.keep_states).demo.queue(max_size=opts.queue_size,
                                                                      default_concurrency_limit=None)
        print(f"k3 ui: model {engine.model}", flush=True)
        log.info("serving %s (kernels %s, trunk placer %s, expert store %s)", engine.model,
                 engine.engine.kernels.name, engine.engine.placer.name, engine.engine.store.name)
        launch(demo, host, opts.port, auth, block=True, access_log=opts.access_log)
    finally:
        engine.close()
    return 0
