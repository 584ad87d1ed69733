"""The page's controls (issue 28, "the page"): choosing a memory preset fills the GB fields with its budgets and
previews the plan they give (editing a field makes the preset custom); without --allow-admin (or a login) the
buttons that would be refused are greyed out, with a line saying why and how to allow them. Layout is checked in
a real browser (tests/browser/test_browser.py)."""
from __future__ import annotations

import pytest
from gradio_client import Client

from tests.ui.test_app import free_port

pytestmark = [pytest.mark.filterwarnings("ignore:.*no_silent_downcasting"),  # Gradio's queue analytics
              pytest.mark.filterwarnings("ignore:The copy keyword is deprecated")]


@pytest.fixture(scope="module")
def trunk_host():
    """An engine on the tiny test model with its packed trunk: the trunk budget means something."""
    from k3core import EngineConfig
    from k3core.testing import models
    from ui.host import EngineHost

    host = EngineHost(EngineConfig(models.model("tiny"), trunk=models.packed_trunk("tiny")))
    yield host
    host.close()


@pytest.fixture(scope="module")
def page(trunk_host, tmp_path_factory):
    from ui.app import build
    from ui.guard import Guard
    from ui.server import launch

    app = build(trunk_host, guard=Guard(admin=True, models_root=tmp_path_factory.mktemp("models")))
    app.demo.queue(max_size=4, default_concurrency_limit=None)
    running = launch(app.demo, "127.0.0.1", free_port(), block=False, quiet=True)
    yield app, Client(running.url, verbose=False)
    running.close()


def handler(app, name):
    """The function an event of the page runs, by its Python name (for the events kept out of the API)."""
    return next(f.fn for f in app.demo.fns.values() if getattr(f.fn, "__name__", "") == name)


def rows(plan: str) -> list[str]:
    """A plan's rows but its total (whose MemAvailable moves between two previews)."""
    return [line for line in plan.splitlines() if not line.strip().startswith("total")]


def component(app, elem_id):
    return next(b for b in app.demo.blocks.values() if getattr(b, "elem_id", None) == elem_id)


def test_choosing_a_preset_fills_the_fields_with_its_budgets_and_previews_them(page):
    from k3core import PRESETS

    _, client = page
    _, small_plan, status = client.predict("custom", 0.001, 0.0001, api_name="/plan_preview")  # 1 MB of trunk
    assert "layers 0..12" not in small_plan and "custom: trunk 0.001 GB, expert cache 0.0001 GB" in status
    for name, (trunk, cache) in PRESETS.items():
        # what the page had (the custom values above) is replaced by the preset's own
        got_trunk, got_cache, _, plan, status = client.predict(name, 0.001, 0.0001, api_name="/plan_choose")
        assert (got_trunk, got_cache) == (trunk, cache), name
        assert status.startswith("preview: fits") and f"{name}: trunk {trunk:g} GB, expert cache {cache:g} GB" in status
        assert rows(plan) != rows(small_plan) and "pinned trunk" in plan and "layers 0..12 and lm_head of 13" in plan
    trunk, cache, _, plan, status = client.predict("custom", 0.001, 0.0001, api_name="/plan_choose")
    assert (trunk, cache, rows(plan)) == (0.001, 0.0001, rows(small_plan))  # custom keeps what the fields say


def test_auto_fills_the_fields_with_the_preset_it_picks(page, monkeypatch):
    from k3core import PRESETS
    from k3core.units import GB

    _, client = page
    monkeypatch.setattr("k3core.plan.budget.mem_available", lambda: int(40 * GB))  # desktop fits, workstation not
    trunk, cache, _, _, status = client.predict("auto", None, 1, api_name="/plan_choose")
    assert (trunk, cache) == PRESETS["desktop"] and "auto → desktop: trunk 16 GB, expert cache 10 GB" in status
    monkeypatch.setattr("k3core.plan.budget.mem_available", lambda: 1 << 20)  # not even laptop: said, fields kept
    *_, plan, status = client.predict("auto", 3, 1, api_name="/plan_choose")
    assert status.startswith("⚠") and "laptop preset" in status


def test_editing_a_field_makes_the_preset_custom_and_previews_it(page):
    app, _ = page
    preset, _, plan, status = handler(app, "edit_fn")(0.001, 0.0001)
    assert preset == "custom" and "layers 0..12 and lm_head" not in plan
    assert "custom: trunk 0.001 GB, expert cache 0.0001 GB" in status
    # only a person's edit or choice fires them: what the handlers set does not loop back as another edit
    config = app.demo.config["dependencies"]
    ids = {name: component(app, elem)._id for name, elem in
           (("preset", "k3-preset"), ("trunk", "k3-trunk-gb"), ("cache", "k3-cache-gb"))}
    triggers = {(t[0], t[1]) for d in config for t in d["targets"] if t[0] in ids.values()}
    assert triggers == {(ids["preset"], "input"), (ids["trunk"], "input"), (ids["cache"], "input")}


@pytest.mark.parametrize("admin", [False, True])
def test_setup_and_apply_are_greyed_out_when_they_would_be_refused(host, tmp_path, admin):
    from ui.app import build
    from ui.guard import ADMIN_FLAG, Guard

    app = build(host, guard=Guard(admin=admin, models_root=tmp_path))
    for elem in ("k3-setup-run", "k3-setup-use", "k3-plan-apply"):
        assert component(app, elem).interactive is admin, elem
    assert component(app, "k3-setup-show").interactive is not False  # reading the state file is fine
    assert component(app, "k3-plan-preview").interactive is not False
    lines = [b for b in app.demo.blocks.values() if getattr(b, "elem_id", None) in ("k3-setup-why", "k3-memory-off")]
    if admin:
        assert lines == []
    else:
        assert len(lines) == 2
        for line in lines:
            assert ADMIN_FLAG in line.value and "--auth USER:PASSWORD" in line.value and "every session" in line.value


def test_a_page_opened_after_the_model_changed_names_the_model_in_force(host, tmp_path, monkeypatch):
    """The header is built once, with the page; each page load redraws it from the engine serving now."""
    from ui.app import build
    from ui.guard import Guard

    app = build(host, guard=Guard(admin=False, models_root=tmp_path))
    title = component(app, "k3-title")
    loads = [d for d in app.demo.config["dependencies"] if any(t[1] == "load" for t in d["targets"])]
    assert any(d["outputs"] == [title._id] for d in loads)
    monkeypatch.setattr("ui.app.header", lambda h: "# another model")
    assert handler(app, "redraw_title")() == "# another model"


def test_the_memory_plan_is_drawn_against_what_is_available():
    """Each row a segment as wide as its share, the room left after them; a plan over the limit drawn past a line."""
    import re

    from k3core.plan.budget import Plan
    from k3core.interfaces import PlanRow
    from ui.plan_picture import plan_picture

    rows = dict(trunk=[PlanRow("pinned trunk", 600, ""), PlanRow("trunk ring", 200, "")],
                experts=[PlanRow("expert cache", 100, "")], state=[PlanRow("KDA state", 1, "")])
    fits = plan_picture(Plan(**rows, available=1000))
    widths = [float(w) for w in re.findall(r'width:([\d.]+)%', fits)]
    assert widths == [60.0, 20.0, 10.0, 0.1, 9.9] and "901 B planned of 1 kB available (99 B left)" in fits
    over = plan_picture(Plan(**rows, available=500))
    assert "k3-plan-limit" in over and "left:55.49%" in over and "does NOT fit" in over
    assert [float(w) for w in re.findall(r'width:([\d.]+)%', over)] == [66.593, 22.198, 11.099, 0.111]
