"""The hook specifications k3's plugin manager (pluggy, project name "k3") calls.

Built-ins in k3core/plugins/ implement these exactly as a third-party package would, through
the entry-point group "k3". Hooks only ever gain optional parameters.

Each hook returns a list of implementations; call order is pluggy's (later-registered
plugins first, `trylast` built-ins at the end). Where k3 picks a kernel backend, expert store or
attention backend without being told a name, it takes the first available one in that order, so an
installed plugin wins over the built-in it replaces. Trunk placers and draft sources are the
exceptions: k3 names the built-in it wants (see k3_trunk_placers, k3_draft_sources), so an installed
one is used only when named.
"""
import pluggy

hookspec = pluggy.HookspecMarker("k3")
hookimpl = pluggy.HookimplMarker("k3")


@hookspec
def k3_attention_backends():
    """Return a list of AttentionBackend instances (k3core.plugin_api).

    Each has a `kind` ("kda" or "mla") and a `name`. For every kind the engine uses the
    backend named on the command line, else the first one returned for that kind.
    """


@hookspec
def k3_kernel_backends():
    """Return a list of KernelBackend instances (k3core.plugin_api), in order of preference.

    The engine uses the backend named by --kernels / K3_KERNELS, else the first one whose
    `available()` is true.
    """


@hookspec
def k3_expert_stores():
    """Return a list of ExpertStore classes (k3core.plugin_api), each with a `name`.

    The engine builds the one named by --expert-store, else the first one returned, from a PluginContext
    (docs/plugins/hooks.md).
    """


@hookspec
def k3_trunk_placers():
    """Return a list of TrunkPlacer classes (k3core.plugin_api), each with a `name`.

    The engine builds the one named by --trunk-placer, else `pinned` when a packed trunk is
    given (--trunk) and `resident` when not.
    """


@hookspec
def k3_draft_sources():
    """Return a list of DraftSource classes (k3core.plugin_api), each with a `name`.

    Used when speculative decoding is asked for (--speculate): `--draft NAME[:ARGUMENT]` picks one by
    name and builds it with the argument (e.g. replay:PATH); without --draft it is the built-in `ngram`,
    whatever is installed. Each must subclass DraftSource. A draft only proposes ids: the engine
    verifies them all in one pass and keeps what it would have produced itself, so a draft changes
    speed, never ids.
    """


@hookspec
def k3_subcommands(subparsers):
    """Add `k3` subcommands: call `subparsers.add_parser(...)` and `set_defaults(func=...)`; the
    function gets the parsed args and returns an exit code. k3's setup wizard and browser UI add
    theirs this way, so k3core never imports them."""
