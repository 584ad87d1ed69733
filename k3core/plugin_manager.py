"""The pluggy plugin manager: built-ins plus the entry-point group "k3", and choosing among them.

K3_PLUGINS=name,name loads only those third-party entry-point plugins; K3_PLUGINS=none loads none.
Built-ins and k3's own packages (the setup wizard, the browser UI) always load. A hook
implementation with a misspelled name fails loudly. `get_plugin_manager()` builds the manager once
per process (per K3_PLUGINS value); `new_plugin_manager(extra)` builds a private one with extra
in-process plugins registered last, so they come first.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import os
from dataclasses import dataclass

import pluggy

from . import __version__, hookspecs
from .errors import PluginError

ENTRY_POINT_GROUP = "k3"
FIRST_PARTY = "k3"  # the distribution k3core, wizard and ui ship in
BUILTIN_PREFIX = "k3."
# The built-in plugins (k3core/plugins/), imported when a manager is built, never when this module is.
# Every built-in hook is `trylast`, so an installed plugin comes first; among trylast hooks pluggy calls
# the earlier registered first, so the native kernels come before the numpy reference.
BUILTINS = ("kda", "mla", "native_kernels", "reference_kernels", "resident", "pinned", "lru_store", "direct_store",
            "drafts", "suffix", "self_draft")


class K3PluginManager(pluggy.PluginManager):
    def __init__(self):
        super().__init__("k3")
        self.dists: dict[str, importlib.metadata.Distribution] = {}  # plugin name -> where it came from


def _load_entry_points(pm: K3PluginManager) -> None:
    wanted = os.environ.get("K3_PLUGINS")
    names = None if wanted is None else {n.strip() for n in wanted.split(",") if n.strip()} - {"none"}
    for dist in importlib.metadata.distributions():
        for ep in dist.entry_points:
            if ep.group != ENTRY_POINT_GROUP or pm.has_plugin(ep.name) or pm.is_blocked(ep.name):
                continue
            if names is not None and dist.metadata["Name"] != FIRST_PARTY and ep.name not in names:
                continue
            pm.register(ep.load(), name=ep.name)
            pm.dists[ep.name] = dist
    missing = sorted((names or set()) - set(pm.dists))
    if missing:
        raise PluginError(f"K3_PLUGINS names {', '.join(map(repr, missing))}, but no such entry point is installed "
                          f"in group {ENTRY_POINT_GROUP!r}")


def new_plugin_manager(extra=()) -> K3PluginManager:
    """Built-ins, then the entry points K3_PLUGINS allows, then `extra` plugin objects (modules or
    objects with @hookimpl methods), checked against the hook specs."""
    pm = K3PluginManager()
    pm.add_hookspecs(hookspecs)
    for name in BUILTINS:
        pm.register(importlib.import_module(f"{__package__}.plugins.{name}"), name=BUILTIN_PREFIX + name)
    try:
        _load_entry_points(pm)
    except PluginError:
        raise
    except Exception as exc:  # a third-party plugin that fails to import must say which
        raise PluginError(f"loading plugins from entry-point group {ENTRY_POINT_GROUP!r} failed: {exc}") from exc
    for plugin in extra:
        pm.register(plugin)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"a plugin implements a hook k3 does not define: {exc}") from exc
    return pm


_MANAGERS: dict[str | None, K3PluginManager] = {}


def get_plugin_manager() -> K3PluginManager:
    """The process's plugin manager for the current K3_PLUGINS selection, built on first use."""
    key = os.environ.get("K3_PLUGINS")
    if key not in _MANAGERS:
        _MANAGERS[key] = new_plugin_manager()
    return _MANAGERS[key]


@dataclass(frozen=True)
class Offered:
    """One implementation a hook returned, and which plugin offered it."""

    item: object
    plugin: str

    @property
    def name(self) -> str:
        return getattr(self.item, "name", repr(self.item))


def offered(pm, hook: str) -> list[Offered]:
    """Every item the plugins return for `hook`, in pluggy's call order (later-registered first,
    `trylast` built-ins at the end), each with the name of the plugin that offered it."""
    out = []
    for impl in reversed(getattr(pm.hook, hook).get_hookimpls()):
        out += [Offered(item, impl.plugin_name) for item in impl.function() or []]
    return out


def origin(pm, plugin: str) -> str:
    """Where a plugin comes from: "built-in", or "DIST VERSION" of its distribution."""
    dist = pm.dists.get(plugin) if isinstance(pm, K3PluginManager) else None
    if dist is not None:
        return f"{dist.metadata['Name']} {dist.version}"
    return "built-in" if plugin.startswith(BUILTIN_PREFIX) else f"in-process plugin {plugin}"


def _pick(options: list[Offered], name: str | None, what: str, flag: str, usable=lambda item: True) -> Offered:
    if name is not None:
        for o in options:
            if o.name == name:
                if not usable(o.item):
                    raise PluginError(f"{what} {name!r} is installed but not available on this machine")
                return o
        known = ", ".join(sorted({o.name for o in options})) or "none"
        raise PluginError(f"no {what} named {name!r} (installed: {known}); see `k3 plugins`")
    for o in options:
        if usable(o.item):
            return o
    raise PluginError(f"no {what} is installed and available; pass {flag} or install a plugin")


def kernel_backends(pm) -> list:
    return [o.item for o in offered(pm, "k3_kernel_backends")]


def choose_kernels(pm, name: str | None = None) -> Offered:
    name = name or os.environ.get("K3_KERNELS") or None
    return _pick(offered(pm, "k3_kernel_backends"), name, "kernel backend", "--kernels", lambda k: k.available())


def attention_backends(pm) -> list:
    return [o.item for o in offered(pm, "k3_attention_backends")]


def choose_attention(pm, kind: str, name: str | None = None):
    return choose_attention_offered(pm, kind, name).item


def choose_attention_offered(pm, kind: str, name: str | None = None) -> Offered:
    options = [o for o in offered(pm, "k3_attention_backends") if o.item.kind == kind]
    return _pick(options, name, f"{kind} attention backend", f"--attention {kind}=NAME")


def expert_stores(pm) -> list:
    return [o.item for o in offered(pm, "k3_expert_stores")]


def choose_expert_store(pm, name: str | None = None) -> Offered:
    return _pick(offered(pm, "k3_expert_stores"), name, "expert store", "--expert-store")


def trunk_placers(pm) -> list:
    return [o.item for o in offered(pm, "k3_trunk_placers")]


def choose_trunk_placer(pm, name: str | None = None) -> Offered:
    return _pick(offered(pm, "k3_trunk_placers"), name, "trunk placer", "--trunk-placer")


def draft_sources(pm) -> list:
    return [o.item for o in offered(pm, "k3_draft_sources")]


def choose_draft(pm, spec: str | None):
    """The draft source `spec` names ("ngram", "replay:PATH", a plugin's), built; None: the first installed."""
    name, _, argument = (spec or "").partition(":")
    chosen = _pick(offered(pm, "k3_draft_sources"), name or None, "draft source", "--draft")
    return chosen.item(argument or None)


def describe_plugins(pm) -> list[dict]:
    """Each registered plugin: name, version, where it comes from, the hooks it implements and
    what each hook provides."""
    rows = []
    for name, plugin in sorted(pm.list_name_plugin(), key=lambda np_: np_[0]):
        if plugin is None:
            continue
        dist = pm.dists.get(name)
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or [])
        rows.append({
            "name": name,
            "version": dist.version if dist else __version__,
            "source": f"entry point of {dist.metadata['Name']}" if dist else "built-in",
            "hooks": hooks,
            "provides": {hook: _provides(plugin, hook) for hook in hooks},
        })
    return rows


def _provides(plugin, hook: str) -> list[str]:
    if hook == "k3_subcommands":  # what commands it adds
        import argparse  # only here: importing the manager (and the front door) loads no argument parser

        sub = argparse.ArgumentParser().add_subparsers()
        getattr(plugin, hook)(subparsers=sub)
        return sorted(sub.choices)
    return [getattr(i, "name", repr(i)) for i in getattr(plugin, hook)() or []]
