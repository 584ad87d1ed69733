"""k3's built-in plugins, registered through the same hooks a third-party package uses."""
from . import direct_store, kda, lru_store, mla, native_kernels, pinned, reference_kernels, resident

# Every built-in hook is `trylast`, so an installed plugin comes first; among trylast hooks pluggy
# calls the earlier registered first, so the native kernels come before the numpy reference.
BUILTINS = [kda, mla, native_kernels, reference_kernels, resident, pinned, lru_store, direct_store]
