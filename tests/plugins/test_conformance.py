"""Every built-in kernel backend (available here), expert store, trunk placer and draft source passes k3's conformance
kit (k3core.testing), the same checks a third party runs on theirs; and `k3 plugins --check` reports
pass/fail per check and exits 1 when one fails, naming it."""
from __future__ import annotations

import pytest

from k3core import plugin_manager as plugins
from k3core.cli.main import main
from k3core.plugin_api import CachePolicy, CachingStore, hookimpl
from k3core.testing import (CheckFailed, attention_backend_checks, draft_source_checks, expert_store_checks,
                            kernel_backend_checks, trunk_placer_checks)

PM = plugins.get_plugin_manager()
CHECKS = ([c for k in plugins.kernel_backends(PM) if k.available() for c in kernel_backend_checks(k)]
          + [c for s in plugins.expert_stores(PM) for c in expert_store_checks(s)]
          + [c for p in plugins.trunk_placers(PM) for c in trunk_placer_checks(p)]
          + [c for o in plugins.offered(PM, "k3_draft_sources") for c in draft_source_checks(o.item)]
          + [c for o in plugins.offered(PM, "k3_attention_backends") for c in attention_backend_checks(o.item)])


@pytest.mark.parametrize("check", CHECKS, ids=str)
def test_every_builtin_passes_the_kit(check):
    check()


def test_plugins_check_prints_each_check_and_fails_naming_it(capsys, monkeypatch):
    assert main(["plugins", "--check", "lru"]) == 0
    out = capsys.readouterr().out
    assert "expert store 'lru' (built-in)" in out and out.count("  PASS  ") == 9 and "0 failed" in out

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


def test_the_first_draft_check_fails_a_class_that_is_not_a_draft_source_subclass():
    class Duck:  # every method a DraftSource has, but not the base class: speculation refuses it
        name, description, memory_bytes = "duck", "", 0

        def __init__(self, argument=None):
            self.argument = argument

        @classmethod
        def example_argument(cls, directory):
            return None

        @classmethod
        def reserve(cls, memory_bytes):
            pass

        def begin(self, prompt):
            pass

        def end(self, history):
            pass

        def propose(self, history, generated, k):
            return []

    first = draft_source_checks(Duck)[0]
    assert "DraftSource subclass" in first.name
    with pytest.raises(CheckFailed, match=r"is not a DraftSource subclass.*`class Duck\(DraftSource\)` with `from "
                                          r"k3core.plugin_api import DraftSource`"):
        first()


class Fifo(CachePolicy):
    """First in, first out, and (unless `counts`) forgetting to count what it evicts."""

    counts = False

    def __init__(self, slots):
        super().__init__(slots)
        self.order = {}

    def access(self, key, keep=()):
        if key in self.order:
            return True, None
        evicted = None
        if len(self.order) >= self.slots:
            evicted = next(k for k in self.order if k not in keep)
            del self.order[evicted]
            self.evictions += self.counts
        self.order[key] = None
        return False, evicted

    def discard(self, key):
        self.order.pop(key, None)


class CountedFifo(Fifo):
    counts = True


def counters_check(rule):
    """The kit's counters check of a CachingStore kept by the CachePolicy class `rule`."""
    class Store(CachingStore):
        name = rule.__name__.lower()

        @classmethod
        def policy(cls, slots, options):
            return rule(slots)

    return next(c for c in expert_store_checks(Store) if "STORE_STATS counters" in c.name)


def test_the_kit_fails_a_cache_policy_that_does_not_count_its_evictions():
    check = counters_check(Fifo)
    assert "counts its evictions" in check.name
    with pytest.raises(CheckFailed, match=r"cache_policy\(16\)\.evictions is 0 after a replay that evicted \d+ keys: "
                                          r"count each eviction"):
        check()
    counters_check(CountedFifo)()  # the same policy counting them passes


def test_an_attention_backend_that_cannot_keep_its_state_inside_a_pass_fails_the_kit_and_the_prompt_cache_says_so():
    """KDA without keep_at: its state has arrays that are not positional, so the prompt cache (on by default) cannot
    keep a checkpoint inside a pass; the kit's check fails naming keep_at, and a PrefixCache refuses the engine."""
    from k3core import EngineConfig, PrefixCache, open_engine
    from k3core.errors import PluginError
    from k3core.interfaces import AttentionBackend
    from k3core.plugins.kda import KDA
    from k3core.testing import models

    class NoKeep(KDA):
        name = "nokeep"
        keep_at = AttentionBackend.keep_at
        kept = AttentionBackend.kept

    backend = NoKeep()
    checks = {c.name.split(": ", 1)[1]: c for c in attention_backend_checks(backend)}
    with pytest.raises(CheckFailed, match="no keep_at: the prompt cache"):
        checks["keep_at keeps, inside a pass, the state forwarding only that far gives"]()

    class Offer:
        @hookimpl
        def k3_attention_backends(self):
            return [backend]

    config = EngineConfig(models.model("tiny"), attention={"kda": "nokeep"})
    with open_engine(config, plugins=[Offer()]) as engine:
        with pytest.raises(PluginError, match="attention backend 'nokeep' .* cannot keep its state inside a pass"):
            PrefixCache(engine, 1 << 20)
