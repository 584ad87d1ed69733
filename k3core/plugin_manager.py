"""The pluggy plugin manager: built-ins plus the entry-point group "k3", and choosing among them.

K3_PLUGINS=name,name loads only those third-party entry-point plugins; K3_PLUGINS=none loads none.
Built-ins and k3's own packages (the setup wizard, the browser UI) always load. A hook
implementation with a misspelled name fails loudly.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import os

import pluggy

from . import __version__, hookspecs
from .errors import PluginError
from .plugins import BUILTINS

ENTRY_POINT_GROUP = "k3"


FIRST_PARTY = "k3"  # the distribution k3core, wizard and ui ship in


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


def get_plugin_manager() -> pluggy.PluginManager:
    pm = K3PluginManager()
    pm.add_hookspecs(hookspecs)
    for module in BUILTINS:
        pm.register(module, name="k3." + module.__name__.rsplit(".", 1)[-1])
    try:
        _load_entry_points(pm)
    except PluginError:
        raise
    except Exception as exc:  # a third-party plugin that fails to import must say which
        raise PluginError(f"loading plugins from entry-point group {ENTRY_POINT_GROUP!r} failed: {exc}") from exc
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"a plugin implements a hook k3 does not define: {exc}") from exc
    return pm


def _pick(items, name: str | None, what: str, flag: str, usable=lambda item: True):
    if name is not None:
        for item in items:
            if item.name == name:
                if not usable(item):
                    raise PluginError(f"{what} {name!r} is installed but not available on this machine")
                return item
        known = ", ".join(sorted({i.name for i in items})) or "none"
        raise PluginError(f"no {what} named {name!r} (installed: {known}); see `k3 plugins`")
    for item in items:
        if usable(item):
            return item
    raise PluginError(f"no {what} is installed and available; pass {flag} or install a plugin")


def _flatten(results) -> list:
    return [item for group in results for item in (group or [])]


def kernel_backends(pm) -> list:
    return _flatten(pm.hook.k3_kernel_backends())


def choose_kernels(pm, name: str | None = None):
    name = name or os.environ.get("K3_KERNELS") or None
    return _pick(kernel_backends(pm), name, "kernel backend", "--kernels", lambda k: k.available())


def attention_backends(pm) -> list:
    return _flatten(pm.hook.k3_attention_backends())


def choose_attention(pm, kind: str, name: str | None = None):
    options = [b for b in attention_backends(pm) if b.kind == kind]
    return _pick(options, name, f"{kind} attention backend", f"--attention {kind}=NAME")


def expert_stores(pm) -> list:
    return _flatten(pm.hook.k3_expert_stores())


def choose_expert_store(pm, name: str | None = None):
    return _pick(expert_stores(pm), name, "expert store", "--expert-store")


def trunk_placers(pm) -> list:
    return _flatten(pm.hook.k3_trunk_placers())


def choose_trunk_placer(pm, name: str | None = None):
    return _pick(trunk_placers(pm), name, "trunk placer", "--trunk-placer")


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
        sub = argparse.ArgumentParser().add_subparsers()
        getattr(plugin, hook)(subparsers=sub)
        return sorted(sub.choices)
    return [getattr(i, "name", repr(i)) for i in getattr(plugin, hook)() or []]


def add_subcommands(subparsers) -> None:
    """Let every plugin (the wizard and the UI among them) add its `k3` subcommands."""
    get_plugin_manager().hook.k3_subcommands(subparsers=subparsers)
