"""The dense SiTU-GLU MLP (MODEL.md §4): layer 0's MLP and the fused shared experts.

SiTU-GLU itself is a kernel (docs/NUMERICS.md); this is the three projections around it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..interfaces import KernelBackend, Weights

if TYPE_CHECKING:
    from ..format.config import Config


def dense_mlp(w: Weights, x: np.ndarray, c: Config, kr: KernelBackend, prefix: str = "mlp.") -> np.ndarray:
    """W_down · SiTU-GLU(W_gate x, W_up x)."""
    g = kr.linear(w[prefix + "gate_proj.weight"], x)
    u = kr.linear(w[prefix + "up_proj.weight"], x)
    return kr.linear(w[prefix + "down_proj.weight"], kr.situ_glu(g, u, c.situ_beta, c.situ_linear_beta))
