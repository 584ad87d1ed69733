"""k3's built-in plugins, registered through the same hooks a third-party package uses: attention (kda,
mla), kernels (native, reference), trunk placers (resident, pinned), expert stores (lru, direct), draft
sources (ngram, replay, suffix). Each
imports k3core.plugin_api and nothing else of k3, exactly as a plugin from outside must."""
from . import direct_store, drafts, kda, lru_store, mla, native_kernels, pinned, reference_kernels, resident, suffix

# Every built-in hook is `trylast`, so an installed plugin comes first; among trylast hooks pluggy
# calls the earlier registered first, so the native kernels come before the numpy reference.
BUILTINS = [kda, mla, native_kernels, reference_kernels, resident, pinned, lru_store, direct_store, drafts, suffix]
