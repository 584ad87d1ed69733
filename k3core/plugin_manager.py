"""The pluggy plugin manager: built-ins plus the entry-point group "k3", and choosing among them.

K3_PLUGINS=name,name loads only those entry-point plugins (built-ins always load);
K3_PLUGINS=none loads none. A hook implementation with a misspelled name fails loudly.
"""
from __future__ import annotations

import os

import pluggy

from . import __version__, hookspecs
from .errors import PluginError
from .plugins import BUILTINS

ENTRY_POINT_GROUP = "k3"


def _load_entry_points(pm: pluggy.PluginManager) -> None:
    wanted = os.environ.get("K3_PLUGINS")
    if wanted is None:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        return
    names = {n.strip() for n in wanted.split(",") if n.strip()} - {"none"}
    for name in sorted(names):
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=name)
        if not pm.has_plugin(name):
            raise PluginError(f"K3_PLUGINS names {name!r}, but no entry point {name!r} is installed "
                              f"in group {ENTRY_POINT_GROUP!r}")


def get_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager("k3")
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
    dists = {id(plugin): dist for plugin, dist in pm.list_plugin_distinfo()}
    rows = []
    for name, plugin in sorted(pm.list_name_plugin(), key=lambda np_: np_[0]):
        if plugin is None:
            continue
        dist = dists.get(id(plugin))
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or [])
        provides = {}
        for hook in hooks:
            items = getattr(plugin, hook)() or []
            provides[hook] = [getattr(i, "name", repr(i)) for i in items]
        rows.append({
            "name": name,
            "version": dist.version if dist else __version__,
            "source": f"entry point of {dist.project_name}" if dist else "built-in",
            "hooks": hooks,
            "provides": provides,
        })
    return rows
