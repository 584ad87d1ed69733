"""Whose conversation an event belongs to: every browser gets a server-issued, unguessable session cookie
(`session_cookie_middleware`, installed by ui/server.py on the app it serves), and a conversation belongs to
the cookie that started it and the tab (`session_key`, read by ui/app.py's handlers), never to an id a client
chooses. A cookie this server did not issue (`k3_session=1`, or one from before a restart) is replaced by a
fresh one, as if none were sent. Not a login: --auth is Gradio's. Checked by tests/ui/test_server.py and
tests/faults/test_clients.py.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets

SESSION_COOKIE = "k3_session"


class Sessions:
    """The tokens this server issued: `secrets.token_urlsafe` ids, each followed by its HMAC under a key that
    lives only in this process. The signature is the server's set of issued tokens: checked in constant time
    (`hmac.compare_digest`), it holds any number of sessions in no memory, so a flood of cookieless requests
    cannot push a real session out (a stored set would have to be bounded, and so evictable)."""

    def __init__(self):
        self._key = secrets.token_bytes(32)

    def _mac(self, token_id: str) -> str:
        return hmac.new(self._key, token_id.encode(), hashlib.sha256).hexdigest()

    def issue(self) -> str:
        token_id = secrets.token_urlsafe(24)
        return f"{token_id}.{self._mac(token_id)}"

    def issued(self, token: str | None) -> bool:
        token_id, dot, mac = (token or "").partition(".")
        return bool(token_id and dot) and hmac.compare_digest(mac.encode(), self._mac(token_id).encode())


SESSIONS = Sessions()  # one per process: the page's middleware and its handlers read the same one


def _cookies_without_ours(header: str | None) -> bytes:
    kept = [part.strip() for part in (header or "").split(";")
            if part.strip() and part.split("=", 1)[0].strip() != SESSION_COOKIE]
    return "; ".join(kept).encode("latin-1")


def session_cookie_middleware(app, sessions: Sessions = SESSIONS) -> None:
    """Give every client without a cookie this server issued a fresh one (HttpOnly, SameSite=Strict), in
    place of whatever it sent; the request that sets it already carries it, so its first event has a session
    too."""

    @app.middleware("http")
    async def issue(request, call_next):
        if sessions.issued(request.cookies.get(SESSION_COOKIE)):
            return await call_next(request)
        token = sessions.issue()
        others = _cookies_without_ours(request.headers.get("cookie"))
        headers = [(k, v) for k, v in request.scope["headers"] if k != b"cookie"]
        request.scope["headers"] = headers + [(b"cookie", f"{SESSION_COOKIE}={token}".encode()
                                               + (b"; " + others if others else b""))]
        response = await call_next(request)
        response.set_cookie(SESSION_COOKIE, token, httponly=True, samesite="strict", path="/")
        return response


def session_key(request, sessions: Sessions = SESSIONS) -> str:
    """Whose conversation an event belongs to: the server-issued cookie, then the tab. Without one (a client
    that drops cookies, or a cookie this server did not issue) the event gets a conversation of its own that
    nobody else can reach."""
    cookie = request.cookies.get(SESSION_COOKIE) if request is not None else None
    owner = cookie if sessions.issued(cookie) else secrets.token_urlsafe(24)
    return f"{owner}/{getattr(request, 'session_hash', None) or '-'}"
