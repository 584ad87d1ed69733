"""k3: run Kimi K3 on one CPU machine, exactly. The public API is the front door, k3core.api, whose
names are importable from here (`from k3core import open_engine, EngineConfig`), with its errors in k3core.errors;
plugins use k3core.plugin_api. Names load on first use and `import k3core` itself imports nothing, so it stays
cheap for the command line and `k3` gets its Ctrl-C handler in place early (k3core/cli/interrupt.py)."""

__version__ = "0.1.0"


def __getattr__(name):
    import importlib
    import importlib.util

    if importlib.util.find_spec(f"{__name__}.{name}") is not None:  # a submodule (`from k3core import io`)
        return importlib.import_module(f".{name}", __name__)
    api = importlib.import_module(".api", __name__)
    if name in api.__all__:
        return getattr(api, name)
    raise AttributeError(f"module 'k3core' has no attribute {name!r}")


def __dir__():
    import importlib

    return sorted([*globals(), *importlib.import_module(".api", __name__).__all__])
