"""Every built-in kernel backend (available here), expert store, trunk placer and draft source passes k3's conformance
kit (k3core.testing), the same checks a third party runs on theirs; and `k3 plugins --check` reports
pass/fail per check and exits 1 when one fails, naming it."""
from __future__ import annotations

import pytest

from k3core import plugin_manager as plugins
from k3core.cli.main import main
from k3core.plugin_api import hookimpl
from k3core.testing import draft_source_checks, expert_store_checks, kernel_backend_checks, trunk_placer_checks

PM = plugins.get_plugin_manager()
CHECKS = ([c for k in plugins.kernel_backends(PM) if k.available() for c in kernel_backend_checks(k)]
          + [c for s in plugins.expert_stores(PM) for c in expert_store_checks(s)]
          + [c for p in plugins.trunk_placers(PM) for c in trunk_placer_checks(p)]
          + [c for o in plugins.offered(PM, "k3_draft_sources") for c in draft_source_checks(o.item)])


@pytest.mark.parametrize("check", CHECKS, ids=str)
def test_every_builtin_passes_the_kit(check):
    check()


def test_plugins_check_prints_each_check_and_fails_naming_it(capsys, monkeypatch):
    assert main(["plugins", "--check", "lru"]) == 0
    out = capsys.readouterr().out
    assert "expert store 'lru' (built-in)" in out and out.count("  PASS  ") == 7 and "0 failed" in out

    from k3core.plugins.lru_store import LRUStore

    class Forgetful(LRUStore):  # counts a hit it never had
        name = "forgetful"

        def stats(self):
            return {**super().stats(), "expert_hits": self.requests}

    class Offer:
        @hookimpl
        def k3_expert_stores(self):
            return [Forgetful]

    pm = plugins.new_plugin_manager([Offer()])
    monkeypatch.setattr("k3core.cli.plugins_command.get_plugin_manager", lambda: pm)
    assert main(["plugins", "--check", "forgetful"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  stats() has the STORE_STATS counters and its cache_policy replays its hits" in out
    assert "1 failed" in out


def test_plugins_check_with_an_unknown_name_lists_what_is_installed(capsys):
    assert main(["plugins", "--check", "nope"]) == 2
    assert "installed: " in capsys.readouterr().err
