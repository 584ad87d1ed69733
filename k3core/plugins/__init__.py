"""k3's built-in plugins, registered through the same hooks a third-party package uses: attention (kda,
mla), kernels (native, reference), trunk placers (resident, pinned), expert stores (lru, direct), draft
sources (ngram, replay, suffix). Each imports k3core.plugin_api and nothing else of k3, exactly as a
plugin from outside must. The plugin manager imports and registers them by module name when it is built
(k3core/plugin_manager.py BUILTINS); nothing here imports them."""
