"""Where `k3 ui` may listen: loopback by default; any other address is refused (exit 2, before the
engine is opened or a socket bound) unless the explicit exposure flag is given, and then a warning
is printed; --auth never prints the password; no public share link, ever."""
from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from k3core.errors import UsageError
from tests.ui.conftest import ui_args
from ui import server


@pytest.mark.parametrize("host", [None, "127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]"])
def test_loopback_is_allowed(host):
    assert server.check_host(host, expose=False) == (host or "127.0.0.1")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "10.0.0.1", "example.com", "localhost.evil"])
def test_anything_else_needs_the_explicit_flag(host):
    with pytest.raises(UsageError, match="i-know-this-exposes-the-model"):
        server.check_host(host, expose=False)
    assert server.check_host(host, expose=True) == host


def test_the_command_refuses_before_opening_anything(tmp_path):
    # a directory that is no model: the refusal must come before the engine is even looked for (a MODEL_DIR that
    # does not exist at all is the parser's own error, before either)
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    out = subprocess.run([sys.executable, "-m", "k3core", "ui", str(empty), "--host", "0.0.0.0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "refusing to listen on 0.0.0.0" in out.stderr and "not-a-model" not in out.stderr


def test_without_a_model_or_a_profile_it_says_how_to_get_one(tmp_path):
    out = subprocess.run([sys.executable, "-m", "k3core", "ui"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "K3_CONFIG_DIR": str(tmp_path)})
    assert out.returncode == 2 and "k3 setup" in out.stderr


def test_auth_is_user_colon_password():
    assert server.parse_auth("me:se:cret") == ("me", "se:cret")
    assert server.parse_auth(None) is None
    for bad in ("nopassword", ":x", "x:"):
        with pytest.raises(UsageError):
            server.parse_auth(bad)


class FakeDemo:
    def __init__(self):
        self.launched = None

    def queue(self, **kw):
        self.queued = kw
        return self


class FakeHost:
    closed = 0

    def __init__(self, config, speculation=lambda: None, prompt_cache=lambda engine, tokenizer: None):
        import threading

        self.config, self.model, self.prompt_cache = config, config.model, None
        named = types.SimpleNamespace(name="stand-in")
        self.engine = types.SimpleNamespace(notices=[], kernels=named, placer=named, store=named, sequences=1)
        self.lock, self.tokenizer, self.generation, self.speculation = threading.Lock(), None, 0, speculation
        self.rss_outside_engine = 0

    def close(self):
        FakeHost.closed += 1


@pytest.fixture
def fake_app(monkeypatch):
    """serve() with a stand-in engine and app: what it asks to serve, without binding anything."""
    demo = FakeDemo()
    monkeypatch.setattr(server, "EngineHost", FakeHost)
    monkeypatch.setattr("ui.app.build", lambda host, keep_states, guard: (
        setattr(demo, "guard", guard), types.SimpleNamespace(demo=demo, host=host))[1])
    monkeypatch.setattr(server, "launch", lambda d, host, port, auth, block, access_log, api, timeouts: setattr(
        demo, "launched", dict(server_name=host, server_port=port, auth=auth, block=block, api=api, timeouts=timeouts)))
    return demo


def test_exposing_warns_never_shares_and_hides_the_password(fake_app, capsys, small_model):
    demo, closed = fake_app, FakeHost.closed
    args = ui_args(small_model, "--host", "0.0.0.0", "--i-know-this-exposes-the-model", "--auth", "me:hunter2",
                   "--port", "7999", "--queue-size", "5")
    assert server.serve(*args) == 0
    out = capsys.readouterr()
    assert "WARNING: listening on 0.0.0.0" in out.err and "hunter2" not in out.out + out.err
    kw = demo.launched
    assert kw["server_name"] == "0.0.0.0" and kw["server_port"] == 7999
    assert kw["auth"] == ("me", "hunter2") and demo.queued["max_size"] == 5 and FakeHost.closed == closed + 1
    assert demo.guard.admin  # a login lets its users run Setup and switch the model
    assert kw["api"] is None and "the OpenAI API (/v1) is off" in out.err  # exposed without an API key


def test_exposed_with_an_api_key_the_openai_api_is_mounted(fake_app, capsys, small_model, monkeypatch):
    monkeypatch.setenv("K3_API_KEY", "a-long-enough-api-key-1234")
    server.serve(*ui_args(small_model, "--host", "0.0.0.0", "--i-know-this-exposes-the-model"))
    out = capsys.readouterr()
    assert fake_app.launched["api"] is not None and "a-long-enough-api-key-1234" not in out.out + out.err


def test_the_default_is_loopback(fake_app, small_model):
    demo = fake_app
    server.serve(*ui_args(small_model))
    assert demo.launched["server_name"] == "127.0.0.1" and demo.launched["server_port"] == 7860
    assert demo.launched["auth"] is None and not demo.guard.admin  # no flag, no login: nothing to steer
    assert demo.launched["api"] is not None  # loopback: the OpenAI API beside the page


def test_the_access_log_has_a_line_per_request(capfd):
    import urllib.request

    import gradio as gr

    from tests.ui.test_app import free_port

    with gr.Blocks() as demo:
        gr.Markdown("hello")
    running = server.launch(demo, "127.0.0.1", free_port(), block=False, quiet=True, access_log=True)
    try:
        urllib.request.urlopen(running.url, timeout=30).read()
    finally:
        running.close()
    out = capfd.readouterr()
    assert '"GET / HTTP/1.1" 200' in out.out + out.err


def test_a_login_guards_v1_with_its_password_unless_an_api_key_is_set(fake_app, capsys, small_model, monkeypatch):
    seen = []
    monkeypatch.setattr(server, "openai_routes", lambda host, opts, key: (seen.append(key), (None, "routes"))[1])
    server.serve(*ui_args(small_model, "--auth", "me:hunter2"))
    out = capsys.readouterr()
    assert seen == ["hunter2"] and fake_app.launched["api"] == "routes"
    assert "Authorization: Bearer PASSWORD" in out.out and "hunter2" not in out.out + out.err
    monkeypatch.setenv("K3_API_KEY", "a-long-enough-api-key-1234")
    server.serve(*ui_args(small_model, "--auth", "me:hunter2"))
    assert seen[-1] == "a-long-enough-api-key-1234"  # the key, as `k3 serve` asks for it
    monkeypatch.delenv("K3_API_KEY")
    server.serve(*ui_args(small_model))
    assert seen[-1] is None  # no login, no key, loopback: /v1 open, as before


def test_the_help_says_how_v1_authenticates_with_a_login(capsys):
    import argparse

    from ui.plugin import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    with pytest.raises(SystemExit):
        parser.parse_args(["ui", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "/v1 then asks for it too: clients send `Authorization: Bearer PASSWORD`" in text


def test_a_session_is_a_token_this_server_issued():
    from ui.session import SESSION_COOKIE, Sessions, session_key

    sessions, other = Sessions(), Sessions()
    token = sessions.issue()
    assert sessions.issued(token) and token != sessions.issue()
    token_id, mac = token.split(".")
    for forged in ("1", "", None, token_id, f"{token_id}.", f"{token_id}.{'0' * 64}", other.issue(),
                   f"{token_id}.{mac[:-1]}", f"x{token}"):
        assert not sessions.issued(forged), forged
    request = types.SimpleNamespace(cookies={SESSION_COOKIE: token}, session_hash="tab")
    assert session_key(request, sessions) == f"{token}/tab"
    made_up = types.SimpleNamespace(cookies={SESSION_COOKIE: "1"}, session_hash="tab")
    first, second = session_key(made_up, sessions), session_key(made_up, sessions)
    assert not first.startswith("1/") and first != second  # a conversation nobody else can reach, not "1"'s


def test_a_cookie_the_server_did_not_issue_is_replaced_other_cookies_kept():
    import fastapi
    from fastapi.responses import JSONResponse
    from fastapi.testclient import TestClient

    from ui.session import SESSION_COOKIE, Sessions, session_cookie_middleware

    app, sessions = fastapi.FastAPI(), Sessions()
    session_cookie_middleware(app, sessions)

    async def seen(request):
        return JSONResponse({"cookie": request.headers.get("cookie")})

    app.add_route("/seen", seen)

    client = TestClient(app)
    r = client.get("/seen", headers={"Cookie": f"theme=dark; {SESSION_COOKIE}=1; lang=en"})
    token = r.cookies[SESSION_COOKIE]
    assert sessions.issued(token) and r.json()["cookie"] == f"{SESSION_COOKIE}={token}; theme=dark; lang=en"
    kept = client.get("/seen", headers={"Cookie": f"{SESSION_COOKIE}={token}"})
    assert SESSION_COOKIE not in kept.cookies and kept.json()["cookie"] == f"{SESSION_COOKIE}={token}"
