"""Nobody but an admin steers the page: without --allow-admin (or a login) Setup, opening the saved profile and
applying budgets are refused to every client (previews still work); with it, Setup writes only under the
models root, from the demo or the Hub, and a refused destination leaves nothing behind."""
from __future__ import annotations

import os

import pytest
from gradio_client import Client

from k3core.errors import UsageError
from tests.ui.test_app import free_port
from ui.guard import Guard


def test_destinations_stay_under_the_models_root(tmp_path):
    root = tmp_path / "models"
    root.mkdir()
    guard = Guard(admin=True, models_root=root)
    assert guard.destination("demo", "demo-model", "") == (root / "demo-model", root / "demo-model" / "trunk")
    assert guard.destination("hf://o/n", str(root / "a"), str(root / "t")) == (root / "a", root / "t")
    (tmp_path / "elsewhere").mkdir()
    (root / "link").symlink_to(tmp_path / "elsewhere")
    (root / "afile").write_text("x")
    for dest, says in (("../escape", "not inside the models root"), ("/etc", "not inside the models root"),
                       ("link/x", "not inside the models root"), (str(root), "not inside the models root"),
                       ("afile", "is a file, not a directory"), ("", "give a destination")):
        with pytest.raises(UsageError, match=says):
            guard.destination("demo", dest, "")
    with pytest.raises(UsageError, match="not inside the models root"):
        guard.destination("demo", "ok", "/tmp/trunk-elsewhere")
    with pytest.raises(UsageError, match="a local checkpoint is set up in place"):
        guard.destination(str(tmp_path / "elsewhere"), "ok", "")
    assert sorted(os.listdir(root)) == ["afile", "link"]  # nothing was created by any refusal
    with pytest.raises(UsageError, match="--allow-admin"):
        Guard(admin=False, models_root=root).destination("demo", "demo-model", "")


@pytest.fixture(scope="module")
def guarded(host, tmp_path_factory):
    """The page as a stranger finds it: no --allow-admin, no login."""
    from ui.app import build
    from ui.server import launch

    root = tmp_path_factory.mktemp("root")
    app = build(host, guard=Guard(admin=False, models_root=root))
    app.demo.queue(max_size=8, default_concurrency_limit=None)
    running = launch(app.demo, "127.0.0.1", free_port(), block=False, quiet=True)
    yield running.url, root, host
    running.close()


def test_without_the_flag_no_client_can_write_files_or_switch_the_model(guarded):
    url, root, host = guarded
    client, engine, plan = Client(url, verbose=False), host.engine, host.engine.plan
    table, _, status = client.predict("demo", "demo-model", "", "auto", False, False, 2, api_name="/setup")
    assert "Setup is off on this page" in status and "--allow-admin" in status
    status, _ = client.predict(api_name="/use_profile")
    assert "off on this page" in status
    *_, status = client.predict("laptop", None, None, True, api_name="/plan_apply")
    assert "not applied" in status and "off on this page" in status
    *_, status = client.predict("laptop", None, None, api_name="/plan_preview")
    assert status.startswith("preview:")  # reading is fine
    assert host.engine is engine and host.engine.plan is plan and os.listdir(root) == []


def test_the_setup_tab_packs_with_the_codec_chosen_and_refuses_an_unknown_one(tmp_path):
    import json

    from ui.setup_tab import run_setup

    root = tmp_path / "models"
    root.mkdir()
    guard = Guard(admin=True, models_root=root)
    *_, (_, _, status) = run_setup(guard, "lz4-source", "bad", "", "auto", False, False, 2, codec="lz4", poll=0.05)
    assert "codec 'lz4' is not one of auto, raw, planes" in status and os.listdir(root) == []
    *_, (table, log, status) = run_setup(guard, "demo", "demo-model", "", "auto", False, False, 2, codec="planes",
                                         poll=0.05, no_tune=True)  # the tune is not what this checks
    assert status.startswith("✓"), (status, log)
    manifest = json.loads((root / "demo-model" / "trunk" / "manifest.json").read_text())
    assert manifest["codec"] == "planes" and "codec planes" in log
