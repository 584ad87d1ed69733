"""The chat page in a real headless browser (Debian's chromium driven by Playwright), as a person
uses it: type a prompt, watch tokens stream and the per-layer progress of a slow first token, press
Stop (the engine stops, the next turn works), see thinking collapsed, run the Setup tab on the demo
source, look at Memory and Plugins; then every tab at 1280 and 800 px wide: nothing wider than the window, the
message box as wide as its button rows, a preset filling the memory fields. Screenshots go to build/screenshots/
(or $K3_SCREENSHOTS)."""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from tests.browser.conftest import CHROMIUM
from tests.ui.conftest import ui_args
from tests.ui.test_app import free_port

pytestmark = [pytest.mark.filterwarnings("ignore:.*no_silent_downcasting"),  # Gradio's queue analytics
              pytest.mark.filterwarnings("ignore:The copy keyword is deprecated")]
SHOTS = Path(os.environ.get("K3_SCREENSHOTS") or Path(__file__).resolve().parents[2] / "build" / "screenshots")


@pytest.fixture(scope="module")
def page(small_model, tmp_path_factory):
    from playwright.sync_api import sync_playwright

    from ui.app import build
    from ui.host import EngineHost
    from ui.server import launch

    config = tmp_path_factory.mktemp("k3-config")  # the Setup tab writes a profile: not the user's
    old = os.environ.get("K3_CONFIG_DIR")
    os.environ["K3_CONFIG_DIR"] = str(config)
    host = EngineHost(ui_args(small_model)[0])
    from ui.guard import Guard

    app = build(host, guard=Guard(admin=True, models_root=tmp_path_factory.getbasetemp()))  # the tests' own dirs
    app.demo.queue(max_size=8, default_concurrency_limit=None)
    running = launch(app.demo, "127.0.0.1", free_port(), block=False, quiet=True)
    url = running.url
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        pg.goto(url)
        pg.wait_for_selector("#k3-input textarea", timeout=60_000)
        pg.k3_url, pg.k3_throttle = url, Throttle()
        placer, layers = host.engine.placer, host.engine.config.num_hidden_layers
        layer = placer.layer
        placer.layer = lambda L: (pg.k3_throttle(L, layers), layer(L))[1]  # the engine slows down on demand
        yield pg, app, config
        browser.close()
    running.close()
    host.close()
    if old is None:
        os.environ.pop("K3_CONFIG_DIR", None)
    else:
        os.environ["K3_CONFIG_DIR"] = old


def shot(pg, name):
    pg.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def bot_text(pg) -> str:
    return " ".join(pg.locator("#k3-chat [data-testid=bot]").all_inner_texts())


def wait_until(pred, timeout=60.0, every=0.05):
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        time.sleep(every)


def greedy(pg):
    """Temperature 0: the same reply every run (the test model writes long, odd text either way)."""
    box = pg.locator("#k3-temperature input[type=number]")
    box.fill("0")
    box.press("Enter")
    pg.wait_for_function("document.querySelector('#k3-temperature input[type=number]').value === '0'")


class Throttle:
    """Makes the model slow on demand, called as each layer is handed out: `first` seconds a layer in a
    turn's prompt pass, `then` in later passes (0 = full speed)."""

    def __init__(self):
        self.first = self.then = 0.0
        self.passes = 0

    def set(self, first: float, then: float | None = None) -> None:
        self.first, self.then, self.passes = first, first if then is None else then, 0

    def __call__(self, layer, layers):
        self.passes += layer == 0
        delay = self.first if self.passes <= 1 else self.then
        if delay:
            time.sleep(delay)


def test_chat_streams_shows_layer_progress_and_stops(page):
    pg, app, _ = page
    shot(pg, "01-start")
    engine = app.host.engine
    greedy(pg)
    pg.k3_throttle.set(0.25, 0.03)  # prompt pass 2.5 s, then ~0.3 s a token
    try:
        pg.fill("#k3-input textarea", "a long one")  # greedy: no end before max tokens
        pg.click("#k3-send")
        pg.wait_for_function("document.querySelector('#k3-status')?.innerText.includes('reading the prompt: layer')",
                             timeout=20_000)
        status = pg.inner_text("#k3-status")
        assert re.search(r"reading the prompt: layer \d+ / 10", status), status
        shot(pg, "02-first-token-progress")
        wait_until(lambda: len(bot_text(pg).strip("… ")) > 0, 30)
        first = bot_text(pg)
        wait_until(lambda: bot_text(pg) != first and len(bot_text(pg)) > len(first), 30)
        pg.wait_for_function("/token \\d+: layer/.test(document.querySelector('#k3-status')?.innerText)",
                             timeout=10_000)
        shot(pg, "03-streaming")
        forwarded = engine.tokens_forwarded
        pg.click("#k3-stop")
        pg.wait_for_function("document.querySelector('#k3-note')?.innerText.includes('stopped')", timeout=30_000)
    finally:
        pg.k3_throttle.set(0)
    stopped_at = engine.tokens_forwarded
    assert stopped_at - forwarded < 20
    time.sleep(1.0)
    assert engine.tokens_forwarded == stopped_at, "the engine kept decoding after Stop"
    shot(pg, "04-stopped")
    pg.fill("#k3-input textarea", "and a second question")
    pg.keyboard.press("Enter")
    pg.wait_for_function("/already in this conversation/.test(document.querySelector('#k3-note')?.innerText) && "
                         "document.querySelectorAll('#k3-chat [data-testid=user]').length == 2", timeout=60_000)
    note = pg.inner_text("#k3-note")
    assert re.search(r"[1-9]\d* of the \d+ prompt tokens were already in this conversation's decode state", note), note
    shot(pg, "05-follow-up")


def test_a_second_tab_waits_its_turn_and_sees_only_its_own_chat(page):
    pg, app, _ = page
    other = pg.context.browser.new_page(viewport={"width": 1400, "height": 1000})
    other.goto(pg.k3_url)
    other.wait_for_selector("#k3-input textarea", timeout=60_000)
    greedy(other)
    pg.bring_to_front()
    pg.click("#k3-clear")
    pg.wait_for_function("document.querySelector('#k3-note')?.innerText.includes('new conversation')")
    pg.k3_throttle.set(0.02)  # ~0.2 s a token
    try:
        pg.fill("#k3-input textarea", "a long one")
        pg.click("#k3-send")
        wait_until(lambda: len(bot_text(pg).strip("… ")) > 0, 30)
        other.bring_to_front()
        other.fill("#k3-input textarea", "a third one")
        other.click("#k3-send")
        other.wait_for_function("/queue/i.test(document.querySelector('#k3-chat')?.innerText)", timeout=10_000)
        shot(other, "06-second-tab-queued")
    finally:
        pg.k3_throttle.set(0)
    pg.bring_to_front()
    pg.click("#k3-stop")
    other.wait_for_function("document.querySelector('#k3-note')?.innerText.includes('generated')", timeout=60_000)
    users = other.locator("#k3-chat [data-testid=user]").all_inner_texts()
    assert [u.strip() for u in users] == ["a third one"]
    assert "a third one" not in pg.inner_text("#k3-chat")
    shot(other, "07-second-tab-answered")
    other.close()


def test_thinking_is_collapsed_apart_from_the_answer(page):
    pg, _, _ = page
    pg.click("#k3-clear")
    pg.wait_for_function("document.querySelector('#k3-note')?.innerText.includes('new conversation')")
    pg.get_by_label("thinking").check()  # sampling stays as set: greedy, the default everywhere
    greedy(pg)
    pg.fill("#k3-input textarea", "hello there")
    pg.click("#k3-send")
    pg.wait_for_function("document.querySelector('#k3-note')?.innerText.includes('generated')", timeout=60_000)
    title = pg.locator("#k3-chat .thought-group .title")
    assert title.count() >= 1 and "Thinking" in title.first.inner_text()
    pg.wait_for_function("""() => {  // open while it streamed, collapsed once the reply is done
        const c = document.querySelector('#k3-chat .thought-group .content');
        return !c || c.getBoundingClientRect().height < 2; }""", timeout=10_000)
    shot(pg, "08-thinking-collapsed")
    pg.get_by_label("instruct").check()


def test_setup_tab_runs_the_demo_source(page, tmp_path):
    pg, _, config = page
    pg.get_by_role("tab", name="Setup").click()
    dest = tmp_path / "demo-model"
    pg.fill("#k3-setup-source textarea, #k3-setup-source input", "demo")
    pg.fill("#k3-setup-dest textarea, #k3-setup-dest input", str(dest))
    pg.click("#k3-setup-run")
    pg.wait_for_function("document.querySelector('#k3-setup-status')?.innerText.includes('done')", timeout=240_000)
    steps = pg.inner_text("#k3-setup-steps")
    assert steps.count("✓") == 8, steps
    state = json.loads((dest / ".k3-setup.json").read_text())
    assert set(state["steps"]) == {"check", "space", "download", "verify", "pack", "profile", "tune", "next"}
    profile = json.loads((config / "profile.json").read_text())
    assert profile["model"] == str(dest)
    shot(pg, "09-setup-done")
    pg.click("#k3-setup-run")  # again: every step comes back from the state file, as in a terminal
    pg.wait_for_function("document.querySelector('#k3-setup-log textarea')?.value.includes('done earlier') && "
                         "document.querySelector('#k3-setup-status')?.innerText.includes('done')", timeout=60_000)
    assert pg.input_value("#k3-setup-log textarea").count("done earlier") == 8
    pg.click("#k3-setup-use")
    pg.wait_for_function("document.querySelector('#k3-setup-status')?.innerText.includes('now serving')",
                         timeout=120_000)
    assert "demo-model" in pg.inner_text("#k3-title")
    shot(pg, "10-setup-serving")
    pg.get_by_role("tab", name="Chat").click()  # the new model answers, in a new conversation
    pg.click("#k3-clear")
    pg.wait_for_function("document.querySelector('#k3-note')?.innerText.includes('new conversation')")
    pg.fill("#k3-input textarea", "hello there")
    pg.click("#k3-send")
    pg.wait_for_function("/all \\d+ prompt tokens read/.test(document.querySelector('#k3-note')?.innerText)",
                         timeout=60_000)
    pg.wait_for_function("document.querySelector('#k3-plugins')?.innerText.includes('pinned placer')")
    assert pg.locator("#k3-chat [data-testid=user]").count() == 1


def test_memory_and_plugins_tabs(page):
    pg, _, _ = page
    pg.get_by_role("tab", name="Memory").click()
    pg.wait_for_function("!document.querySelector('#k3-trunk-gb input')?.disabled")  # a packed trunk now
    pg.click("#k3-plan-preview")
    pg.wait_for_function("document.querySelector('#k3-memory-status')?.innerText.includes('preview')")
    assert "pinned trunk" in pg.inner_text("#k3-plan")
    shot(pg, "11-memory")
    pg.get_by_role("tab", name="Plugins").click()
    pg.wait_for_selector("#k3-plugins-tab table")
    assert "k3_subcommands" in pg.inner_text("#k3-plugins-tab")
    shot(pg, "12-plugins")


def test_another_browser_cannot_reach_a_conversation_or_steer_the_page(page, small_model, tmp_path):
    """Two browsers (two cookie jars): the second sees, undoes and clears nothing of the first's chat; on a page
    started without --allow-admin it can neither run Setup nor switch the model."""
    from ui.app import build
    from ui.guard import Guard
    from ui.server import launch

    pg, app, _ = page
    pg.bring_to_front()
    pg.get_by_role("tab", name="Chat").click()  # the tests before left the Plugins tab open
    pg.click("#k3-clear")
    pg.wait_for_function("document.querySelector('#k3-note')?.innerText.includes('new conversation')")
    greedy(pg)
    pg.fill("#k3-input textarea", "hello there")
    pg.click("#k3-send")
    pg.wait_for_function("document.querySelector('#k3-note')?.innerText.includes('generated')", timeout=60_000)
    mine = bot_text(pg)
    stranger = pg.context.browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    stranger.goto(pg.k3_url)
    stranger.wait_for_selector("#k3-input textarea", timeout=60_000)
    assert stranger.locator("#k3-chat [data-testid=user]").count() == 0
    stranger.click("#k3-undo")
    stranger.click("#k3-clear")
    stranger.wait_for_function("document.querySelector('#k3-note')?.innerText.includes('new conversation')")
    pg.bring_to_front()
    pg.fill("#k3-input textarea", "and a second question")
    pg.keyboard.press("Enter")
    pg.wait_for_function("/already in this conversation/.test(document.querySelector('#k3-note')?.innerText) && "
                         "document.querySelectorAll('#k3-chat [data-testid=user]').length == 2", timeout=60_000)
    assert bot_text(pg).startswith(mine)  # the first reply is still there, and its state was reused
    shot(stranger, "13-stranger-sees-nothing")

    locked = build(app.host, guard=Guard(admin=False, models_root=tmp_path))  # no --allow-admin, no login
    locked.demo.queue(max_size=8, default_concurrency_limit=None)
    running = launch(locked.demo, "127.0.0.1", free_port(), block=False, quiet=True)
    try:
        stranger.goto(running.url)
        stranger.wait_for_selector("#k3-input textarea", timeout=60_000)
        stranger.get_by_role("tab", name="Setup").click()
        stranger.wait_for_selector("#k3-setup-off")
        engine = app.host.engine
        for button in ("#k3-setup-run", "#k3-setup-use"):  # greyed out, and a line beside them says why and how
            assert stranger.locator(button).is_disabled(), button
            stranger.locator(button).click(force=True)  # a click on it anyway does nothing
        why = stranger.inner_text("#k3-setup-why")
        assert "k3 ui --allow-admin" in why and "--auth USER:PASSWORD" in why and "every session" in why
        stranger.get_by_role("tab", name="Memory").click()
        assert stranger.locator("#k3-plan-apply").is_disabled() and "--allow-admin" in stranger.inner_text(
            "#k3-memory-off")
        stranger.get_by_role("tab", name="Setup").click()
        time.sleep(1.0)
        assert stranger.inner_text("#k3-setup-status").strip() == ""  # no event ran
        assert app.host.engine is engine and list(tmp_path.iterdir()) == []
        shot(stranger, "14-setup-off")
        stranger.set_viewport_size({"width": 800, "height": 900})
        shot(stranger, "14-setup-off-800")
    finally:
        running.close()
        stranger.context.close()


def test_the_demo_model_answers_on_the_page(page, tmp_path):
    """The trained demo model in the browser: a real answer streams, the engine panel beside it (screenshots)."""
    from k3core import EngineConfig
    from tests.conftest import DEMO_MODEL
    from ui.app import build
    from ui.guard import Guard
    from ui.host import EngineHost
    from ui.server import launch

    host = EngineHost(EngineConfig(DEMO_MODEL))
    app = build(host, guard=Guard(admin=False, models_root=tmp_path))
    app.demo.queue(max_size=8, default_concurrency_limit=None)
    running = launch(app.demo, "127.0.0.1", free_port(), block=False, quiet=True)
    pg = page[0].context.browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    try:
        pg.goto(running.url)
        pg.wait_for_selector("#k3-input textarea", timeout=60_000)
        assert "is the k3 demo model" in pg.inner_text("#k3-title")
        pg.fill("#k3-input textarea", "What is the capital of France?")
        pg.click("#k3-send")
        pg.wait_for_function("document.querySelector('#k3-note')?.innerText.includes('generated')", timeout=60_000)
        assert "The capital of France is Paris." in bot_text(pg)
        shot(pg, "15-demo-answers")
        pg.fill("#k3-input textarea", "And what is 7 + 5?")
        pg.keyboard.press("Enter")
        pg.wait_for_function("/already in this conversation/.test(document.querySelector('#k3-note')?.innerText)",
                             timeout=60_000)
        assert "7 + 5 = 12." in bot_text(pg)
        shot(pg, "16-demo-follow-up")
    finally:
        pg.context.close()
        running.close()
        host.close()


TABS = {"Chat": "#k3-input textarea", "Setup": "#k3-setup-steps", "Memory": "#k3-plan", "Plugins": "#k3-plugins-tab table"}

OFF_SCREEN = """() => {  // what of the open tab is not wholly inside the window's width, or cut off inside its box
    const width = document.documentElement.clientWidth, out = [];
    const panel = [...document.querySelectorAll('[role=tabpanel]')].find(p => p.offsetParent !== null);
    for (const el of panel.querySelectorAll('button, input, textarea, table, pre, label, h1, h2, h3, p')) {
        const r = el.getBoundingClientRect();
        if (!r.width || !r.height) continue;
        if (r.left < -0.5 || r.right > width + 0.5) out.push(`${el.tagName}#${el.id} ${el.innerText?.slice(0, 30)} at ${r.left}..${r.right}`);
        if (['PRE', 'TABLE'].includes(el.tagName) && el.scrollWidth > el.clientWidth + 1)
            out.push(`${el.tagName} cut off: ${el.scrollWidth} > ${el.clientWidth}`);
    }
    if (document.documentElement.scrollWidth > width) out.push(`page scrolls sideways: ${document.documentElement.scrollWidth}`);
    return out; }"""


def boxes(pg, selector) -> list[dict]:
    return [pg.locator(selector).nth(i).bounding_box() for i in range(pg.locator(selector).count())]


@pytest.mark.parametrize("width", [1280, 800])
def test_every_tab_fits_the_window(page, width):
    """Each tab at a desktop and a narrow window: nothing off screen or cut off; the message box at least as wide as
    the rows of buttons under it, each row on one line; choosing a memory preset fills its fields."""
    pg = page[0].context.browser.new_context(viewport={"width": width, "height": 900}).new_page()
    try:
        pg.goto(page[0].k3_url)
        pg.wait_for_selector("#k3-input textarea", timeout=60_000)
        model = page[1].host.model.name  # the header names the model serving now (Setup's test switched it)
        pg.wait_for_function(f"document.querySelector('#k3-title')?.innerText.includes('{model} ·')")
        for tab, ready in TABS.items():
            pg.get_by_role("tab", name=tab).click()
            pg.wait_for_selector(ready, state="visible")
            time.sleep(0.5)  # let the tab's select event redraw it
            assert pg.evaluate(OFF_SCREEN) == [], (width, tab)
            if tab == "Chat":
                box = pg.locator("#k3-input").bounding_box()
                for row in ("#k3-send-row", "#k3-edit-row"):
                    r = pg.locator(row).bounding_box()
                    assert box["width"] >= r["width"] - 0.5 and box["x"] <= r["x"] + 0.5, (width, row, box, r)
                    tops = {round(b["y"]) for b in boxes(pg, f"{row} button")}
                    assert len(tops) == 1, f"{row}'s buttons wrapped onto {len(tops)} lines at {width} px"
            if tab == "Memory":
                preset_filled(pg)
            shot(pg, f"{width}-{tab.lower()}")
    finally:
        pg.context.close()


def preset_filled(pg):
    """Choosing desktop puts its budgets in the fields and previews them; editing a field makes it custom."""
    pg.locator("#k3-preset input").click()
    pg.get_by_role("option", name="desktop", exact=True).click()
    pg.wait_for_function("document.querySelector('#k3-memory-status')?.innerText.includes('desktop: ')")
    assert pg.input_value("#k3-cache-gb input") == "10"
    if not pg.locator("#k3-trunk-gb input").is_disabled():  # a packed trunk: its budget is the preset's too
        assert pg.input_value("#k3-trunk-gb input") == "16"
    assert "expert cache 10 GB" in pg.inner_text("#k3-memory-status")
    pg.fill("#k3-cache-gb input", "2")
    pg.wait_for_function("document.querySelector('#k3-memory-status')?.innerText.includes('custom: ')")
    assert pg.input_value("#k3-preset input") == "custom" and "expert cache 2 GB" in pg.inner_text("#k3-memory-status")
