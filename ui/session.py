"""Whose conversation an event belongs to: every browser gets a server-issued, unguessable session cookie
(`session_cookie_middleware`, installed by ui/server.py on the app it serves), and a conversation belongs to
the cookie that started it and the tab (`session_key`, read by ui/app.py's handlers), never to an id a client
chooses. Checked by tests/ui/test_server.py.
"""
from __future__ import annotations

import secrets

SESSION_COOKIE = "k3_session"


def session_cookie_middleware(app) -> None:
    """Give every client without one a random session cookie (HttpOnly, SameSite=Strict); the request that
    sets it already carries it, so its first event has a session too."""

    @app.middleware("http")
    async def issue(request, call_next):
        if request.cookies.get(SESSION_COOKIE) is None:
            token = secrets.token_urlsafe(24)
            cookie = f"{SESSION_COOKIE}={token}".encode()
            headers = [(k, v) for k, v in request.scope["headers"] if k != b"cookie"]
            old = request.headers.get("cookie")
            request.scope["headers"] = headers + [(b"cookie", cookie + (b"; " + old.encode() if old else b""))]
            response = await call_next(request)
            response.set_cookie(SESSION_COOKIE, token, httponly=True, samesite="strict", path="/")
            return response
        return await call_next(request)


def session_key(request) -> str:
    """Whose conversation an event belongs to: the server-issued cookie, then the tab. Without the cookie
    (a client that drops cookies) the event gets a conversation of its own that nobody else can reach."""
    cookie = request.cookies.get(SESSION_COOKIE) if request is not None else None
    return f"{cookie or secrets.token_urlsafe(24)}/{getattr(request, 'session_hash', None) or '-'}"
