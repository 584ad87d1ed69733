"""Where `k3 serve` and `k3 ui` listen and who may call them. One host policy (`check_host`): 127.0.0.1 by
default, any loopback address always, any other only when the command's guard is present — for `k3 serve` an
API key (--api-key or K3_API_KEY), for `k3 ui` its --i-know-this-exposes-the-model — else it refuses to start,
naming the guard. The key is never printed or logged. How long a client may take to send a request (`Timeouts`,
enforced by serve/deadlines.py). The server flags both commands take (`add_server_arguments`)."""
from __future__ import annotations

import argparse
import functools
import ipaddress
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from k3core.errors import UsageError

log = logging.getLogger("k3.serve")
KEY_ENV = "K3_API_KEY"
MIN_KEY_CHARS = 16


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


def api_key(given: str | None) -> str | None:
    """The key from --api-key, else K3_API_KEY; None when neither is set. A short key is refused."""
    key = given if given is not None else os.environ.get(KEY_ENV)
    if key is None or key == "":
        return None
    if len(key) < MIN_KEY_CHARS or any(c.isspace() for c in key):
        raise UsageError(f"the API key must be at least {MIN_KEY_CHARS} characters without spaces (e.g. "
                         "`python -c 'import secrets; print(secrets.token_urlsafe(24))'`)")
    return key


KEY_GUARD = "an API key"  # what `k3 serve` needs to listen beyond loopback, and how to give it:
HOW_TO_SET_A_KEY = f"Set {KEY_ENV} (or --api-key) to a secret; clients then send `Authorization: Bearer KEY`"


def check_host(host: str | None, guarded: bool, guard: str, how_to_allow: str) -> str:
    """The address to bind (None: 127.0.0.1): a loopback address always; any other only when the caller's
    guard is present (`guarded`), else a UsageError naming the guard (`guard`) and how to add it."""
    host = host or "127.0.0.1"
    if is_loopback(host) or guarded:
        return host
    raise UsageError(f"refusing to listen on {host} without {guard}: anyone who can reach it could use the model. "
                     f"{how_to_allow}. The default, 127.0.0.1, is this machine only")


@dataclass(frozen=True)
class Timeouts:
    """Seconds a client has to send a request's headers (from the connection opening, or the previous reply
    ending) and then its body; a slower one gets 408 and is disconnected."""

    header: float = 10.0
    body: float = 60.0


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 1..65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number, got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number in 1..65535, got {value}")
    return value


def seconds(text: str) -> float:
    """An argparse type: a time limit in seconds, more than 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a count of at least 1 (a server-only count: the engine's own flags are checked by
    EngineConfig, named as flags)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_server_arguments(group, default_port: int, host_guard: str) -> None:
    """The server flags `k3 serve` and `k3 ui` both take: --host (any address but loopback also needs
    `host_guard`, as check_host refuses it), --port, the two request timeouts, --api-key (for the /v1 routes) and
    --queue-size. --access-log and the prompt cache's flags are k3core's (add_logging_arguments,
    add_prompt_cache_arguments); each command adds its own flags to `group` after these."""
    group.add_argument("--host", metavar="ADDR",
                       help=f"address to listen on (default 127.0.0.1); any other needs {host_guard}")
    group.add_argument("--port", type=port_number, default=default_port, metavar="N",
                       help=f"port, 1..65535 (default {default_port})")
    group.add_argument("--header-timeout", type=seconds, default=Timeouts.header, metavar="S",
                       help=f"a request's headers must arrive whole within S seconds of the connection opening (or of "
                            f"the previous reply ending); slower clients get 408 and are disconnected (default "
                            f"{Timeouts.header:g})")
    group.add_argument("--body-timeout", type=seconds, default=Timeouts.body, metavar="S",
                       help=f"a request's body must arrive whole within S seconds of its headers; slower clients get "
                            f"408 and are disconnected (default {Timeouts.body:g})")
    group.add_argument("--api-key", metavar="KEY",
                       help=f"the /v1 routes ask for `Authorization: Bearer KEY` (prefer {KEY_ENV}: a flag shows in "
                            f"the process list); at least {MIN_KEY_CHARS} characters. Without one, /v1 is served on "
                            "loopback only")
    group.add_argument("--queue-size", type=positive_int, default=16, metavar="N",
                       help="requests that may wait for the engine (default 16); more are turned away (429 with "
                            "Retry-After on /v1)")


def timeouts_from_args(args) -> Timeouts:
    return Timeouts(header=args.header_timeout, body=args.body_timeout)


SHUTDOWN_GRACE = 3.0  # seconds a stopping server gives open requests (a page's event stream never ends by itself)


@dataclass
class Listening:
    url: str
    server: object
    thread: threading.Thread

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def listen(app, host: str, port: int, access_log: bool = False, timeouts: Timeouts = Timeouts()) -> Listening:
    """Serve `app` on host:port (0: any free port) in a thread, with uvicorn's h11 protocol held to `timeouts`;
    returns once it listens."""
    import uvicorn

    from .deadlines import DeadlineProtocol

    protocol = functools.partial(DeadlineProtocol, header_timeout=timeouts.header, body_timeout=timeouts.body)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=access_log,
                                           http=protocol, timeout_graceful_shutdown=SHUTDOWN_GRACE))
    if access_log:
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)
    thread = threading.Thread(target=server.run, name="k3-serve-http", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise UsageError(f"could not listen on {host}:{port} (in use, or not an address of this machine)")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]  # the one bound when 0 asked for any free port
    return Listening(f"http://{f'[{host}]' if ':' in host else host}:{port}", server, thread)


def model_id(model: Path) -> str:
    return Path(model).name or "k3"


def warn_exposed(host: str) -> None:
    print(f"k3 serve: listening on {host}, not just this machine: every request needs the API key; traffic is "
          "plain HTTP (put a TLS proxy in front for anything but a trusted network)", file=sys.stderr)
