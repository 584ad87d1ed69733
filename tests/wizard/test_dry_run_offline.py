"""`k3 setup --dry-run` with the Hub out of reach (no network is used: the HTTP transport refuses every request, or
HF_HUB_OFFLINE is set): the plan from the published shard sizes k3 ships (or the sizes the last run recorded), the
disk needed and free, the times at the measured disk rate, and what it could not check."""
from __future__ import annotations

import httpx2
import huggingface_hub.constants as hf_constants
import pytest

from wizard import dryrun
from wizard import plan as plan_module
from wizard.steps import Setup

from .conftest import REPO, setup_args

ENDPOINT = "https://hub.invalid"
REASON = f"cannot reach {ENDPOINT} (ConnectError: [Errno 101] Network is unreachable)"


@pytest.fixture
def offline(monkeypatch):
    """Every HTTP request fails as with no network; the disk reads at 1 GB/s. Returns the URLs tried."""
    tried = []

    def refuse(self, request):
        tried.append(str(request.url))
        raise httpx2.ConnectError("[Errno 101] Network is unreachable", request=request)

    monkeypatch.setattr(httpx2.HTTPTransport, "handle_request", refuse)
    monkeypatch.setenv("HF_ENDPOINT", ENDPOINT)
    monkeypatch.setattr(dryrun, "measure_read", lambda path, mib: {"bytes_per_s": 1e9})
    return tried


def test_offline_dry_run_plans_the_released_checkpoint_from_the_published_sizes(offline, k3, tmp_path, monkeypatch):
    monkeypatch.setattr(plan_module, "free_bytes", lambda path: 4 * 10**12)
    dest = tmp_path / "Kimi-K3"
    rc, out, err = k3(*setup_args(dest, "hf://moonshotai/Kimi-K3", "--dry-run"))
    assert (rc, err) == (0, "")
    assert out == f"""\
k3 setup --dry-run: hf://moonshotai/Kimi-K3 -> {dest}  (nothing is written)
  source       hf://moonshotai/Kimi-K3@main: not resolved to a commit (the Hub was not reached: see below)  ({ENDPOINT})
  files        94 weight shard(s), 1.56 TB, by the published shard sizes k3 ships; the config/tokenizer files \
(a few MB) only the Hub lists
  left out     2 vision shard(s), 895 MB (--vision fetches them)
  destination  {dest}; packed trunk in {dest}/trunk
  disk         checkpoint 1.56 TB + packed trunk 114 GB = 1.67 TB needed, 4 TB free on {tmp_path}: fits
  rates        network not measured (the Hub was not reached), disk read 1 GB/s (measured)
  [1/8] machine check k3 doctor's checks (a few s)
  [2/8] space         the check above, again (a few s)
  [3/8] download      1.56 TB in 3 parallel streams (time unknown offline; about 3 h 28 min at 1 Gbit/s)
  [4/8] verify        re-read 1.56 TB: size and hash of every file (about 26 min)
  [5/8] pack          114 GB into {dest}/trunk, codec chosen from the disk and CPU rates (raw or planes) (4-48 min)
  [6/8] profile       preset auto, saved for k3 run / k3 chat (instant)
  [7/8] tune          skipped (--no-tune) (instant)
  [8/8] next          print the command to run next (instant)
  not checked  the Hub's current file list, the commit main points at now, the network rate
               network unreachable: {REASON}
  -> run it once the Hub answers: k3 setup --source hf://moonshotai/Kimi-K3 --dest {dest} --yes
"""
    assert [u for u in offline if u.startswith(ENDPOINT)] == [f"{ENDPOINT}/api/models/moonshotai/Kimi-K3/revision/main"]
    assert not dest.exists()


def test_offline_dry_run_with_hf_hub_offline_set_says_so_and_still_refuses_what_does_not_fit(offline, k3, tmp_path,
                                                                                           monkeypatch):
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(plan_module, "free_bytes", lambda path: 10**12)
    dest = tmp_path / "Kimi-K3"
    rc, out, err = k3(*setup_args(dest, "hf://moonshotai/Kimi-K3", "--dry-run", "--vision"))
    assert (rc, err) == (2, "")
    lines = out.splitlines()
    assert lines[2] == ("  files        96 weight shard(s), 1.56 TB, by the published shard sizes k3 ships; the "
                        "config/tokenizer files (a few MB) only the Hub lists")
    assert lines[4] == (f"  disk         not enough free space: checkpoint 1.56 TB + packed trunk 114 GB = 1.67 TB "
                        f"(+268 MB to spare) must fit on the filesystem of {tmp_path}, which has 1 TB free. Free some "
                        "space, choose another --dest, put the packed trunk on another drive with --trunk-dir, or skip "
                        "packing with --no-pack")
    assert lines[-3:] == ["  not checked  the Hub's current file list, the commit main points at now, the network rate",
                          "               network not used: HF_HUB_OFFLINE is set",
                          "  -> would be refused before the first byte: not enough free space"]
    assert not [u for u in offline if u.startswith(ENDPOINT)]   # huggingface_hub refuses them itself


def test_offline_dry_run_of_a_repository_without_published_sizes_says_what_it_knows(offline, k3, tmp_path,
                                                                                    monkeypatch):
    dest = tmp_path / "model"
    rc, out, err = k3(*setup_args(dest, f"hf://{REPO}", "--dry-run"))
    free = plan_module.human(plan_module.free_bytes(tmp_path))
    assert (rc, err) == (2, "")
    assert out == f"""\
k3 setup --dry-run: hf://{REPO} -> {dest}  (nothing is written)
  source       hf://{REPO}@main: not resolved to a commit (the Hub was not reached: see below)  ({ENDPOINT})
  files        unknown: only the Hub lists the files of {REPO} (k3 ships the shard sizes of the released \
moonshotai/Kimi-K3 alone)
  destination  {dest}
  disk         {free} free on {tmp_path}; what is needed is unknown without the file list
  not checked  the Hub's current file list, the commit main points at now, the network rate
               network unreachable: {REASON}
  -> no plan without the Hub's file list: run it again once the network is back
"""


def interrupt(self):
    raise KeyboardInterrupt


def test_offline_dry_run_of_a_started_setup_plans_with_what_the_last_run_recorded(hub, k3, tmp_path, monkeypatch,
                                                                                  request):
    dest = tmp_path / "model"
    with monkeypatch.context() as m:
        m.setattr(Setup, "step_download", interrupt)
        assert k3(*setup_args(dest))[0] == 130            # the files are listed and recorded, none fetched
    request.getfixturevalue("offline")
    rc, out, err = k3(*setup_args(dest, f"hf://{REPO}", "--dry-run"))
    assert (rc, err) == (0, ""), err
    lines = out.splitlines()
    assert lines[1] == (f"  source       hf://{REPO}@main: not resolved to a commit (the Hub was not reached: see "
                        f"below)  ({ENDPOINT})")
    assert lines[2].startswith("  files        11 weight shard(s), ") and lines[2].endswith(
        f", as the last run recorded them in {dest}/.k3-setup.json at commit {hub.sha}; 5 config/tokenizer file(s), "
        + lines[2].rsplit(", ", 1)[1])
    assert lines[-3:] == ["  not checked  the Hub's current file list, the commit main points at now, the network rate",
                          f"               network unreachable: {REASON}",
                          f"  -> run it once the Hub answers: k3 setup --source hf://{REPO} --dest {dest} --yes"]


def test_a_dry_run_of_the_demo_says_it_copies_the_trained_model(k3, tmp_path):
    from k3core.units import human
    from wizard.demo import demo_bytes

    rc, out, _ = k3(*setup_args(tmp_path / "demo", "demo", "--dry-run"))
    assert rc == 0 and "generate" not in out
    assert f"  source       the trained demo model shipped with k3 ({human(demo_bytes())}; not Kimi K3)\n" in out
    assert "  [3/8] download      copy the demo model and check each file's sha256 (a few s)\n" in out
