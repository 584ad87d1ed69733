"""The Gradio app launched in-process on 127.0.0.1 (a free port), driven over HTTP by gradio_client
as any API user would: a streamed reply; a cancelled job stops the engine and the next request
works; Stop; two concurrent sessions never see each other's history or state, the second waiting
in the queue with its position reported; the queue is bounded."""
from __future__ import annotations

import socket
import time

import pytest

from k3core.generation.sampling import SamplingParams
from k3core.generation.channels import visible
from tests.ui.conftest import slowed

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client  # noqa: E402
from gradio_client.utils import Status  # noqa: E402

QUEUE = 3
pytestmark = [pytest.mark.filterwarnings("ignore:.*no_silent_downcasting"),  # Gradio's queue analytics
              pytest.mark.filterwarnings("ignore:The copy keyword is deprecated")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(host, tmp_path_factory):
    from ui.app import build
    from ui.guard import Guard
    from ui.server import ServerOptions, launch, openai_routes

    app = build(host, guard=Guard(admin=True, models_root=tmp_path_factory.mktemp("models")))
    app.demo.queue(max_size=QUEUE, default_concurrency_limit=None)
    worker, api = openai_routes(host, ServerOptions(), None)
    running = launch(app.demo, "127.0.0.1", free_port(), block=False, quiet=True, api=api)
    yield app, running.url
    running.close()
    worker.close()


def test_the_openai_api_is_served_beside_the_page_by_the_same_engine(served, host, reference):
    import openai

    _, url = served
    client = openai.OpenAI(base_url=url + "v1", api_key="none", max_retries=0, timeout=120)
    forwarded = host.engine.tokens_forwarded
    r = client.chat.completions.create(model=host.model.name, messages=[{"role": "user", "content": "hello there"}],
                                       temperature=0, max_tokens=6)
    assert host.engine.tokens_forwarded > forwarded  # the page's own engine did the work
    assert r.choices[0].message.content == reference(["hello there"])[0][1]
    assert Client(url, verbose=False).predict(api_name="/session") is not None  # and the page still answers


@pytest.mark.parametrize("method, path", [("GET", "v1/chat/completions"), ("GET", "v1/messages"),
                                          ("POST", "v1/models"), ("DELETE", "v1/completions"), ("GET", "v1/nowhere"),
                                          ("PUT", "health")])
def test_the_openai_api_beside_the_page_answers_a_wrong_method_or_path_as_k3_serve_does(served, method, path):
    """The page is mounted at /, yet GET /v1/chat/completions is 405 with Allow: POST and an invalid_request_error
    (not the page's 404 {"detail": "Not Found"}), exactly as `k3 serve` answers it."""
    import httpx
    from fastapi.testclient import TestClient

    from serve.api import ApiOptions
    from serve.app import build_app

    _, url = served
    mine = httpx.request(method, url + path, timeout=30)
    serve = TestClient(build_app(None, ApiOptions())).request(method, "/" + path)  # errors before any engine work
    assert (mine.status_code, mine.headers.get("allow"), mine.json()) == \
        (serve.status_code, serve.headers.get("allow"), serve.json())
    if path == "v1/chat/completions":
        assert mine.status_code == 405 and mine.headers["allow"] == "POST"
        assert mine.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(url, timeout=30).status_code == 200  # and the page is still at /


def send(client, text, max_tokens=6, **kw):
    return client.submit(text, "instruct", "", 0.0, 1.0, 0, max_tokens, "", api_name="/send", **kw)


def chatbot(outputs) -> list[dict]:
    return outputs[0]


def contents(messages, role):
    return [m["content"][0]["text"] if isinstance(m["content"], list) else m["content"]
            for m in messages if m["role"] == role]


def session(client) -> dict:
    return client.predict(api_name="/session")


def wait_for(pred, timeout=30.0):
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def test_it_listens_on_loopback_only(served):
    app, url = served
    assert url.startswith("http://127.0.0.1:") and app.demo.share is False


def test_a_reply_streams_over_http(served, reference):
    _, url = served
    client = Client(url, verbose=False)
    job = send(client, "hello there")
    job.result(timeout=60)
    outs = job.outputs()
    assert len(outs) >= 3, "waiting, then pieces, then the finished reply"
    final = chatbot(outs[-1])
    assert contents(final, "user") == ["hello there"]
    assert contents(final, "assistant") == [visible(reference(["hello there"])[0][1])]  # escapes shown, not obeyed
    assert "reached max tokens" in outs[-1][2]


def test_a_cancelled_job_stops_the_engine_and_the_next_request_works(served, host, reference):
    _, url = served
    client = Client(url, verbose=False)
    with slowed(host.engine, 0.003):
        job = send(client, "hello there", max_tokens=400)
        wait_for(lambda: len(job.outputs()) >= 3)
        job.cancel()
        wait_for(lambda: session(client)["last"].get("reason") == "cancelled")
    info = session(client)
    assert 0 < info["last"]["generated_tokens"] < 400 and info["state_live"]
    nxt = send(client, "and a second question")
    final = nxt.result(timeout=60)
    after = session(client)
    assert after["last"]["reason"] == "max tokens"
    assert after["last"]["reused_tokens"] == info["state_tokens"] > 0
    assert contents(chatbot(final), "user") == ["hello there", "and a second question"]


def test_stop_ends_the_reply_and_returns_it(served, host):
    _, url = served
    client = Client(url, verbose=False)
    with slowed(host.engine, 0.003):
        job = send(client, "hello there", max_tokens=400)
        wait_for(lambda: len(job.outputs()) >= 3)
        messages, note, panel = client.predict(api_name="/stop")
    assert session(client)["last"]["reason"] == "cancelled"
    assert contents(messages, "user") == ["hello there"] and "stopped" in note
    assert 'id="k3-status">idle' in panel and "cancelled" in panel
    wait_for(job.done)


def test_two_sessions_never_see_each_others_history_or_state(served, host, reference):
    _, url = served
    a, b = Client(url, verbose=False), Client(url, verbose=False)
    statuses = []
    with slowed(host.engine, 0.004):
        ja = send(a, "hello there", max_tokens=12)
        wait_for(lambda: len(ja.outputs()) >= 2)
        jb = send(b, "a third one", max_tokens=12)
        while not jb.done():
            statuses.append(jb.status())
            time.sleep(0.02)
        ra, rb = ja.result(timeout=60), jb.result(timeout=60)
    queued = [s for s in statuses if s.code == Status.IN_QUEUE and s.rank is not None]
    assert queued and queued[0].rank == 0, "b waited behind a, and was told its place in the queue"
    ja, jb = send(a, "and a second question"), send(b, "fourth")  # interleaved on one engine
    ra, rb = ja.result(timeout=60), jb.result(timeout=60)
    assert contents(chatbot(ra), "user") == ["hello there", "and a second question"]
    assert contents(chatbot(rb), "user") == ["a third one", "fourth"]
    ref_a = reference(["hello there"], params=SamplingParams(max_tokens=12))
    ref_b = reference(["a third one"], params=SamplingParams(max_tokens=12))
    assert contents(chatbot(ra), "assistant")[0] == visible(ref_a[0][1])
    assert contents(chatbot(rb), "assistant")[0] == visible(ref_b[0][1])
    sa, sb = session(a), session(b)
    assert sa["last"]["reused_tokens"] > 0 and sb["last"]["reused_tokens"] > 0
    assert sa["last"]["answer"] != sb["last"]["answer"]


def test_the_queue_is_bounded(served, host):
    _, url = served
    clients = [Client(url, verbose=False) for _ in range(QUEUE + 2)]
    with slowed(host.engine, 0.004):
        jobs = [send(c, "hello there", max_tokens=12) for c in clients]
        for j in jobs:
            wait_for(j.done, 90)
    refused = [j for j in jobs if j.exception() is not None]
    assert refused and "queue is full" in str(refused[0].exception()).lower()
    assert len(refused) < len(jobs)


def test_the_memory_plan_previews_and_applying_reopens_the_engine(served, host, monkeypatch):
    _, url = served
    client = Client(url, verbose=False)
    picture, plan, status = client.predict("desktop", None, None, api_name="/plan_preview")
    assert "memory plan" in plan and "preview: fits" in status and "planned of" in picture
    with monkeypatch.context() as m:
        m.setattr("k3core.plan.budget.mem_available", lambda: 100 << 20)  # a machine with 100 MB free
        picture, plan, status = client.predict("custom", None, 1, api_name="/plan_preview")
    assert "does NOT fit" in status and "does NOT fit" in picture and "k3-plan-limit" in picture
    send(client, "hello there").result(timeout=60)
    old = host.engine
    _, plan, status = client.predict("laptop", None, None, False, api_name="/plan_apply")
    assert status.startswith("applied") and host.engine is not old and host.budget["preset"] == "laptop"
    final = send(client, "and a second question").result(timeout=60)
    assert "the engine was reopened" in final[2] and session(client)["last"]["reused_tokens"] == 0
    with monkeypatch.context() as m:  # budgets that need a terabyte: refused before the engine is closed
        m.setattr("k3core.plan.budget.WORKING_BYTES", 1 << 40)
        _, plan, status = client.predict("custom", None, 1, False, api_name="/plan_apply")
    assert "not applied" in status and "DOES NOT FIT" in status and host.budget["preset"] == "laptop"  # the old budgets came back


def test_the_api_parameters_have_real_names(served):
    _, url = served
    api = Client(url, verbose=False).view_api(return_format="dict", print_info=False)
    send = api["named_endpoints"]["/send"]["parameters"]
    names = [p["parameter_name"] for p in send]
    assert names == ["message", "mode", "system_prompt", "temperature", "top_p", "top_k", "max_tokens", "seed"]
    defaults = {p["parameter_name"]: p.get("parameter_default") for p in send}
    assert defaults["temperature"] == 0.0  # greedy, as `k3 run` and `k3 chat`


def test_another_client_presenting_the_same_session_id_reaches_nothing(served):
    _, url = served
    a, b = Client(url, verbose=False), Client(url, verbose=False)
    b.session_hash = a.session_hash  # what a hostile client can choose freely
    send(a, "hello there").result(timeout=60)
    mine = session(a)
    assert mine["messages"] == 2 and mine["history_tokens"] > 0
    assert session(b)["messages"] == 0  # b's cookie is b's own: the server issued it
    b.predict(api_name="/undo")
    b.predict(api_name="/clear")
    assert session(a) == mine  # a's conversation is untouched
    assert a.cookies.get("k3_session") and a.cookies["k3_session"] != b.cookies.get("k3_session")


def test_a_refused_retry_takes_nothing_back(served):
    from gradio_client.exceptions import AppError

    _, url = served
    client = Client(url, verbose=False)
    send(client, "hello there").result(timeout=60)
    before = session(client)
    with pytest.raises(AppError, match="Seed: give a whole number"):
        client.predict("instruct", "", 0.5, 1.0, 0, 6, "abc", api_name="/retry")
    assert session(client) == before and before["messages"] == 2  # the last turn is still there
