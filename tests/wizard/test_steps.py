"""End-to-end `k3 setup` runs: from the mock Hub, the demo and a local directory; the plan (--dry-run); the
free-space refusal before the first byte; the pinned revision; resuming at the right step."""
from __future__ import annotations

import json
import shutil

import pytest

from k3core.machine import checks as doctor
from k3core.plan.profile import load_profile
from k3core.machine.cost import choose_codec
from wizard import plan as plan_module
from wizard.steps import Setup
from wizard.verify import published_sizes

from .conftest import REPO, VISION_SHARD, setup_args, state_of


def test_hf_setup_end_to_end(hub, k3, tmp_path, small_files):
    dest = tmp_path / "model"
    rc, out, err = k3(*setup_args(dest))
    assert rc == 0, err
    for i, title in enumerate(["machine check", "destination and free space", "download", "verify",
                               "pack the trunk", "profile", "tune", "next command"], 1):
        assert f"[{i}/8] {title}: " in out
    assert "[7/8] tune: skipped (--no-tune)" in out
    assert f"main = commit {hub.sha[:12]}" in out and "fits" in out and "k3 chat" in out
    # every file but the vision shard, byte for byte; the index without the vision shard, the Hub's beside it
    assert not (dest / VISION_SHARD).exists()
    for name, data in small_files.items():
        if name not in (VISION_SHARD, "model.safetensors.index.json"):
            assert (dest / name).read_bytes() == data, name
    assert (dest / "model.safetensors.index.hub.json").read_bytes() == small_files["model.safetensors.index.json"]
    index = json.loads((dest / "model.safetensors.index.json").read_text())
    assert VISION_SHARD not in index["weight_map"].values()
    for name, data in small_files.items():   # each file once; of each shard also its header (the trunk estimate)
        header = 8 + int.from_bytes(data[:8], "little") if name.endswith(".safetensors") else 0
        assert hub.served[name] == header + (len(data) if name != VISION_SHARD else 0), name
    # the profile k3 run / k3 chat use
    profile = load_profile()
    assert profile.model == str(dest) and profile.trunk == str(dest / "trunk") and profile.preset
    assert profile.source == f"hf://{REPO}@{hub.sha}"
    assert (dest / "trunk" / "manifest.json").exists()
    st = state_of(dest)
    assert st["facts"]["commit"] == hub.sha and set(st["steps"]) == {
        "check", "space", "download", "verify", "pack", "profile", "tune", "next"}
    # a second run does nothing and fetches nothing
    served = sum(hub.served.values())
    rc, out, _ = k3(*setup_args(dest))
    assert rc == 0 and out.count("done earlier") == 8 and sum(hub.served.values()) == served


def test_vision_on_request(hub, k3, tmp_path, small_files):
    dest = tmp_path / "model"
    rc, _, err = k3(*setup_args(dest, f"hf://{REPO}", "--vision", "--no-pack"))
    assert rc == 0, err
    assert (dest / VISION_SHARD).read_bytes() == small_files[VISION_SHARD]
    assert (dest / "model.safetensors.index.json").read_bytes() == small_files["model.safetensors.index.json"]
    assert not (dest / "trunk").exists() and load_profile().trunk is None


def test_demo_then_run_from_profile(k3, tmp_path):
    import logging

    dest = tmp_path / "demo"
    rc, out, err = k3("setup", "--source", "demo", "--dest", dest, "--yes", "--read-mb", "1", "--log-level", "info",
                      "--no-tune")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[1] == (f"          step 6 saves the profile (which model k3 run, chat and ui use) in {tmp_path}/"
                        "k3-config/profile.json; K3_CONFIG_DIR=DIR saves it in DIR instead")  # said before it happens
    assert (f"[5/8] pack the trunk: k3 pack {dest} {dest}/trunk, codec raw or planes, chosen from the disk and CPU "
            "rates (2-15 s)") in lines  # the codec choice's own timing counted (it took 5 s, "about 1 s" said)
    assert "copy the trained demo model" in out and "each sha256 as shipped" in out and "saved" in out
    assert "fits in RAM; nothing streams" in out and "1.56 TB" not in out + err  # sized for the demo
    assert "k3.setup: step 1/8 check: started" in err and "k3.setup: step 8/8 next: done" in err
    logging.getLogger().setLevel(logging.WARNING)
    assert load_profile().model == str(dest)
    rc, out, err = k3("run", "--chat", "What is the capital of France?", "--max-tokens", "40")
    assert rc == 0, err
    assert out.strip() == "The capital of France is Paris." and "trunk placer pinned" in err
    assert "is the k3 demo model" in err
    assert k3("verify", dest)[0] == 0


def test_local_directory_in_place(k3, tmp_path, small_model):
    here = shutil.copytree(small_model, tmp_path / "ckpt")
    rc, out, err = k3("setup", "--source", here, "--yes", "--read-mb", "1", "--no-tune")
    assert rc == 0, err
    assert "nothing to download" in out and "sha256 of each recorded" in out
    assert all(r["sha256"] for r in state_of(here)["files"].values())
    assert k3("verify", here)[0] == 0
    assert k3("setup", "--source", here, "--dest", tmp_path / "elsewhere", "--yes")[0] == 2


def test_not_a_checkpoint_is_refused(k3, tmp_path):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hello")
    rc, _, err = k3("setup", "--source", tmp_path / "junk", "--yes", "--read-mb", "1")
    assert rc == 2 and "config.json" in err


def test_dry_run_plans_and_writes_nothing(hub, k3, tmp_path):
    dest = tmp_path / "model"
    rc, out, err = k3(*setup_args(dest, f"hf://{REPO}", "--dry-run"))
    assert rc == 0, err
    assert not dest.exists()
    assert f"commit {hub.sha}" in out and "11 weight shard(s)" in out and "1 vision shard(s)" in out
    assert "needed" in out and "free on" in out and "fits" in out
    assert "network" in out and "(measured)" in out and "about" in out
    assert all(f"[{i}/8]" in out for i in range(1, 9))


def test_no_space_refused_before_the_first_byte(hub, k3, tmp_path, monkeypatch):
    # the official repository's listing (the published sizes): 1.56 TB + the packed trunk on a 1 TB disk
    table = published_sizes()
    hub.add_repo("moonshotai/Kimi-K3", {name: b"x" for name in table} | {"config.json": b"{}"})
    hub.listing_sizes.update(table)
    monkeypatch.setattr(plan_module, "free_bytes", lambda path: 10**12)
    dest = tmp_path / "model"
    rc, out, err = k3(*setup_args(dest, "hf://moonshotai/Kimi-K3"))
    assert rc == 2
    assert "not enough free space" in err and "1.56 TB" in err and "packed trunk" in err and "--trunk-dir" in err
    assert not any("/resolve/" in r[1] for r in hub.requests)            # not one byte asked for
    assert not [p for p in dest.iterdir() if not p.name.startswith(".k3-")]
    assert "[3/8]" not in out


def test_no_space_for_another_repository(hub, k3, tmp_path, monkeypatch):
    monkeypatch.setattr(plan_module, "free_bytes", lambda path: 1 << 20)
    dest = tmp_path / "model"
    rc, _, err = k3(*setup_args(dest))
    assert rc == 2 and "not enough free space" in err
    assert not (dest / ".k3-partial").exists() and not list(dest.glob("*.safetensors"))
    # only the shards' headers were read (for the trunk estimate), never their data
    assert all(r[2] and r[2].startswith("bytes=") for r in hub.requests if "/resolve/" in r[1])


def interrupt(self):
    raise KeyboardInterrupt      # what Ctrl-C (or a kill) between two steps looks like to the wizard


def test_killed_between_steps_resumes_at_the_right_step(hub, k3, tmp_path, monkeypatch):
    dest = tmp_path / "model"
    with monkeypatch.context() as m:
        m.setattr(Setup, "step_pack", interrupt)
        rc, _, err = k3(*setup_args(dest))
    assert rc == 130 and "To continue: k3 setup" in err
    assert set(state_of(dest)["steps"]) == {"check", "space", "download", "verify"}
    served, checks = sum(hub.served.values()), []
    real = doctor.run_checks
    monkeypatch.setattr(doctor, "run_checks", lambda *a: checks.append(a) or real(*a))
    rc, out, err = k3(*setup_args(dest))
    assert rc == 0, err
    assert [line.split(":")[0] for line in out.splitlines() if "done earlier" in line] == [
        "[1/8] machine check", "[2/8] destination and free space", "[3/8] download", "[4/8] verify"]
    assert "[5/8] pack the trunk: k3 pack" in out
    assert checks == [] and sum(hub.served.values()) == served


def test_revision_resolved_once(hub, k3, tmp_path, small_files, monkeypatch):
    dest = tmp_path / "model"
    with monkeypatch.context() as m:
        m.setattr(Setup, "step_download", interrupt)
        assert k3(*setup_args(dest))[0] == 130
    new = hub.move_main(REPO, small_files | {"config.json": b"{}"})
    hub.requests.clear()
    assert k3(*setup_args(dest))[0] == 0
    resolved = [r[1] for r in hub.requests if "/resolve/" in r[1]]
    assert resolved and all(f"/resolve/{hub.sha}/" in p for p in resolved) and new not in str(hub.requests)
    assert not any("/revision/" in r[1] for r in hub.requests)


def test_another_source_in_the_same_destination_is_refused(hub, k3, tmp_path):
    dest = tmp_path / "model"
    assert k3(*setup_args(dest, f"hf://{REPO}", "--no-pack"))[0] == 0
    rc, _, err = k3(*setup_args(dest, f"hf://{REPO}@other"))
    assert rc == 2 and "run the same command as before" in err


def test_plugin_adds_setup_and_verify(k3):
    rc, out, _ = k3("plugins")
    assert "wizard" in out and "setup" in out and "verify" in out


def test_help_text(capsys):
    from k3core.cli.main import main
    with pytest.raises(SystemExit):
        main(["setup", "--help"])
    out = capsys.readouterr().out
    for flag in ("--source", "--dest", "--trunk-dir", "--preset", "--vision", "--jobs", "--yes", "--dry-run",
                 "--no-pack", "examples:", "hf://", "HF_TOKEN", "HF_ENDPOINT", "resume"):
        assert flag in out, flag


def test_a_destination_that_cannot_be_written_is_refused_naming_it(k3, tmp_path):
    (tmp_path / "afile").write_text("x")
    for dest, says in ((tmp_path / "afile", "a file, not a directory"), (tmp_path / "afile" / "sub", "cannot write")):
        rc, _, err = k3("setup", "--source", "demo", "--dest", dest, "--yes", "--read-mb", "1", "--no-tune")
        assert rc == 2 and f"--dest {dest}" in err and says in err, err
    assert (tmp_path / "afile").read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_the_codec_is_chosen_from_the_measured_rates_or_as_asked(hub, k3, tmp_path, monkeypatch):
    from wizard import steps

    asked = []
    monkeypatch.setattr(steps, "choose_trunk_codec", lambda disk: asked.append(disk) or choose_codec(disk, 2, 3e9, 9e9))
    dest = tmp_path / "model"
    rc, out, err = k3(*setup_args(dest))
    assert rc == 0, err
    disk = state_of(dest)["facts"]["disk_rate"]
    assert asked == [disk] and f"disk {disk / 1e9:.2f} GB/s, 2 cores" in out
    want = choose_codec(disk, 2, 3e9, 9e9).codec
    assert json.loads((dest / "trunk" / "manifest.json").read_text()).get("codec", "raw") == want
    assert f"codec {want} (" in out
    other = "raw" if want == "planes" else "planes"  # asking for the other one packs again, with it
    rc, out, err = k3(*setup_args(dest, f"hf://{REPO}", "--codec", other))
    assert rc == 0, err
    assert json.loads((dest / "trunk" / "manifest.json").read_text()).get("codec", "raw") == other
    assert len(asked) == 1 and f"codec {other} (" in out


def test_planes_pays_where_cores_restore_faster_than_the_disk_saves():
    assert choose_codec(7e9, 2, 3.2e9, 8.9e9).codec == "raw"        # a fast NVMe and two cores: CPU-bound
    assert choose_codec(7e9, 8, 3.2e9, 8.9e9).codec == "planes"     # the same disk, eight cores
    slow = choose_codec(1.5e9, 2, 3.2e9, 8.9e9)                     # this machine's kind of disk
    assert slow.codec == "planes" and slow.planes_seconds < slow.raw_seconds
    assert "1.50 GB/s, 2 cores" in slow.why
