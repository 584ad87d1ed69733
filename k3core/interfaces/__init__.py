"""The typed interfaces a plugin implements or receives, one module per plugin kind: kernels (KernelBackend),
attention (AttentionBackend), experts (ExpertStore, and the CachePolicy a store and `k3 sim-cache` share), trunk
(TrunkPlacer), drafts (DraftSource, DraftTarget); base, what every kind shares (Plugin, ContextPlugin and the context
an expert store or trunk placer is built from); tensors, what crosses them (Param, Weights, ExpertWeights,
TensorSpec). Plugins reach all of it through k3core.plugin_api; the contract in words is docs/plugins/hooks.md. Arrays
are numpy; activations crossing an interface are float32, C-contiguous.
"""
from .attention import AttentionBackend
from .base import Budget, ContextPlugin, PlanRow, Plugin, PluginContext, PluginOptions, io_seconds
from .drafts import DraftSource, DraftTarget
from .experts import CachePolicy, ExpertStore, LRUPolicy
from .kernels import KERNEL_FAMILIES, KernelBackend, default_threads, kernel_names
from .tensors import ExpertWeights, Param, TensorSpec, Weights
from .trunk import TrunkPlacer

__all__ = ["AttentionBackend", "Budget", "CachePolicy", "ContextPlugin", "DraftSource", "DraftTarget", "ExpertStore",
           "ExpertWeights", "KERNEL_FAMILIES", "KernelBackend", "LRUPolicy", "Param", "PlanRow", "Plugin",
           "PluginContext", "PluginOptions", "TensorSpec", "TrunkPlacer", "Weights", "default_threads", "io_seconds",
           "kernel_names"]
