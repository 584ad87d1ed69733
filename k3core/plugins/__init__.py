"""k3's built-in plugins, registered through the same hooks a third-party package uses."""
from . import direct_store, kda, mla, reference_kernels, resident

BUILTINS = [kda, mla, reference_kernels, resident, direct_store]
