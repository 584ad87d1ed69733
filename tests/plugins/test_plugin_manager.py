"""Plugins: built-ins go through the same hooks as third parties; an installed plugin wins over
a `trylast` built-in; entry points load (or not, per K3_PLUGINS); a misspelled hook fails loudly."""
import textwrap

import pytest

from k3core import _native
from k3core import plugin_manager as plugins
from k3core import EngineConfig, greedy_ids, open_engine
from k3core.errors import PluginError
from k3core.hookspecs import hookimpl
from k3core.plugins.kda import KDA
from k3core.plugins.reference_kernels import ReferenceKernels


class CountingKDA(KDA):
    name = "counting-kda"
    calls = 0

    def forward(self, *args):
        CountingKDA.calls += 1
        return super().forward(*args)


class ThirdParty:
    @hookimpl
    def k3_attention_backends(self):
        return [CountingKDA()]


def install_dist(tmp_path, monkeypatch, module_source, name="thirdparty"):
    """A minimal installed distribution with an entry point in group "k3"."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(module_source))
    info = tmp_path / f"{name}-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text(f"[k3]\n{name} = {name}\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_every_kind_has_a_builtin_registered_through_the_hooks():
    pm = plugins.new_plugin_manager()
    assert [b.name for b in plugins.kernel_backends(pm)] == ["avx512", "avx2", "neon", "scalar", "reference"]
    assert {(b.kind, b.name) for b in plugins.attention_backends(pm)} == {("kda", "kda"), ("mla", "mla")}
    assert [s.name for s in plugins.expert_stores(pm)] == ["lru", "direct"]
    assert [p.name for p in plugins.trunk_placers(pm)] == ["resident", "pinned"]


def test_an_installed_attention_plugin_wins_over_the_trylast_builtin(tiny_model):
    pm = plugins.new_plugin_manager([ThirdParty()])
    assert plugins.choose_attention(pm, "kda").name == "counting-kda"
    assert plugins.choose_attention(pm, "kda", "kda").name == "kda"
    CountingKDA.calls = 0
    with open_engine(EngineConfig(tiny_model), plugins=[ThirdParty()]) as engine:
        ids, _ = greedy_ids(engine, [1, 2, 3], 2)
        assert any("'counting-kda'" in n and "the default here" in n for n in engine.notices)
    assert CountingKDA.calls > 0
    with open_engine(EngineConfig(tiny_model)) as engine:
        assert greedy_ids(engine, [1, 2, 3], 2)[0] == ids


def test_the_first_available_kernel_backend_is_chosen():
    class Unavailable(ReferenceKernels):
        name = "needs-a-gpu"

        def available(self):
            return False

    class Offers:
        @hookimpl
        def k3_kernel_backends(self):
            return [Unavailable()]

    pm = plugins.new_plugin_manager()
    pm.register(Offers())
    assert plugins.kernel_backends(pm)[0].name == "needs-a-gpu"
    assert plugins.choose_kernels(pm).name == _native.available_backends()[0]
    with pytest.raises(PluginError, match="not available on this machine"):
        plugins.choose_kernels(pm, "needs-a-gpu")


def test_an_installed_plugin_that_becomes_the_default_says_so_on_every_run(tmp_path, monkeypatch, tiny_model,
                                                                          capsys):
    install_dist(tmp_path, monkeypatch, """
        from k3core.plugin_api import hookimpl
        from k3core.plugins.lru_store import LRUStore

        class Mine(LRUStore):
            name = "mine"

        @hookimpl
        def k3_expert_stores():
            return [Mine]
    """, name="mystore")
    monkeypatch.setenv("K3_PLUGINS", "mystore")
    from k3core.cli.main import main

    for _ in range(2):
        assert main(["run", str(tiny_model), "--ids", "1,2", "--gen", "2", "--quiet"]) == 0
        err = capsys.readouterr().err
        assert err.count("k3: using expert store 'mine' from mystore 1.2.3 (an installed plugin, the default "
                         "here); --expert-store NAME picks another") == 1
    assert main(["run", str(tiny_model), "--ids", "1,2", "--gen", "2", "--quiet", "--expert-store", "lru"]) == 0
    assert "k3: using" not in capsys.readouterr().err  # named on the command line: nothing to say


def test_entry_point_plugins_load_and_report_their_version(tmp_path, monkeypatch):
    install_dist(tmp_path, monkeypatch, """
        from k3core.hookspecs import hookimpl
        from k3core.plugins.direct_store import DirectStore

        class OtherStore(DirectStore):
            name = "other"

        @hookimpl
        def k3_expert_stores():
            return [OtherStore]
    """)
    monkeypatch.setenv("K3_PLUGINS", "thirdparty")
    pm = plugins.new_plugin_manager()
    assert [s.name for s in plugins.expert_stores(pm)] == ["other", "lru", "direct"]
    row = next(r for r in plugins.describe_plugins(pm) if r["name"] == "thirdparty")
    assert row["version"] == "1.2.3" and row["provides"] == {"k3_expert_stores": ["other"]}
    monkeypatch.setenv("K3_PLUGINS", "none")
    assert [s.name for s in plugins.expert_stores(plugins.new_plugin_manager())] == ["lru", "direct"]
    monkeypatch.setenv("K3_PLUGINS", "missing-one")
    with pytest.raises(PluginError, match="missing-one"):
        plugins.new_plugin_manager()


def test_a_misspelled_hook_fails_loudly(tmp_path, monkeypatch):
    install_dist(tmp_path, monkeypatch, """
        from k3core.hookspecs import hookimpl

        @hookimpl
        def k3_kernel_backend():
            return []
    """, name="typo")
    monkeypatch.delenv("K3_PLUGINS", raising=False)
    with pytest.raises(PluginError, match="k3_kernel_backend"):
        plugins.new_plugin_manager()


def test_the_process_plugin_manager_is_built_once_per_selection(monkeypatch):
    monkeypatch.setenv("K3_PLUGINS", "none")
    assert plugins.get_plugin_manager() is plugins.get_plugin_manager()
    monkeypatch.delenv("K3_PLUGINS")
    assert plugins.get_plugin_manager() is plugins.get_plugin_manager()


def test_unknown_names_list_what_is_installed():
    pm = plugins.new_plugin_manager()
    with pytest.raises(PluginError, match=r"installed: direct, lru"):
        plugins.choose_expert_store(pm, "lru-typo")


def test_an_installed_trunk_placer_or_draft_source_is_used_only_when_named(tmp_path, monkeypatch, tiny_model, capsys):
    install_dist(tmp_path, monkeypatch, """
        from k3core.plugin_api import hookimpl
        from k3core.plugins.drafts import NgramDraft
        from k3core.plugins.resident import ResidentPlacer

        class TheirPlacer(ResidentPlacer):
            name, built = "theirs", 0

            def __init__(self, ctx):
                super().__init__(ctx)
                TheirPlacer.built += 1

        class TheirDraft(NgramDraft):
            name, built = "theirs", 0

            def __init__(self, argument=None):
                super().__init__(argument)
                TheirDraft.built += 1

        @hookimpl
        def k3_trunk_placers():
            return [TheirPlacer]

        @hookimpl
        def k3_draft_sources():
            return [TheirDraft]
    """, name="theirdraft")
    monkeypatch.setenv("K3_PLUGINS", "theirdraft")
    from k3core.cli.main import main

    base = ["run", str(tiny_model), "--ids", "3,1,4,1,5,9,2,6", "--gen", "6", "--speculate", "2"]
    assert main(base) == 0
    err = capsys.readouterr().err
    assert "trunk placer resident" in err and "drafts from ngram: " in err and "k3: using" not in err
    import theirdraft
    assert (theirdraft.TheirPlacer.built, theirdraft.TheirDraft.built) == (0, 0)  # first in call order, yet unused
    assert main([*base, "--trunk-placer", "theirs", "--draft", "theirs"]) == 0
    err = capsys.readouterr().err
    assert "trunk placer theirs" in err and "drafts from theirs: " in err
    assert theirdraft.TheirPlacer.built == 1 and theirdraft.TheirDraft.built >= 1
