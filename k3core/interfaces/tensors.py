"""Tensors as the engine hands them around: one stored tensor (Param), a layer's trunk tensors by name (Weights)
and one routed expert's MXFP4 bytes (ExpertWeights); what a config implies (TensorSpec) is the checkpoint
format's (k3core.format.checkpoint), named here too for the plugins."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..errors import CheckpointError
from ..format.checkpoint import TensorSpec

__all__ = ["ExpertWeights", "Param", "TensorSpec", "Weights"]


class Param:
    """One tensor as stored: the raw array (BF16 as uint16 bits) and its safetensors dtype."""

    __slots__ = ("data", "dtype", "name")

    def __init__(self, data: np.ndarray, dtype: str, name: str = ""):
        self.data, self.dtype, self.name = data, dtype, name

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    def f32(self) -> np.ndarray:
        """The values widened to float32 (exact for BF16 and F16, whose bits may come as uint16)."""
        if self.dtype == "BF16":
            return (self.data.astype(np.uint32) << 16).view(np.float32)
        if self.dtype == "F16":
            return self.data.view(np.float16).astype(np.float32)
        return self.data.astype(np.float32)


class Weights(Mapping[str, Param]):
    """A layer's (or the model's) trunk tensors by name relative to their prefix."""

    def __init__(self, prefix: str, params: Mapping[str, Param]):
        self.prefix, self._params = prefix, dict(params)

    def __getitem__(self, name: str) -> Param:
        try:
            return self._params[name]
        except KeyError:
            raise CheckpointError("tensor not loaded for this layer", tensor=self.prefix + name) from None

    def __iter__(self):
        return iter(self._params)

    def __len__(self):
        return len(self._params)

    def vec(self, name: str) -> np.ndarray:
        """A small tensor widened to float32 (MODEL.md §3: widen small vectors at load)."""
        return self[name].f32()

    @property
    def nbytes(self) -> int:
        return sum(p.data.nbytes for p in self._params.values())


@dataclass(frozen=True)
class ExpertWeights:
    """One routed expert in MXFP4: packed nibbles [rows, in/2] and E8M0 scales [rows, in/32]."""

    layer: int
    expert: int
    w1_packed: np.ndarray
    w1_scale: np.ndarray
    w2_packed: np.ndarray
    w2_scale: np.ndarray
    w3_packed: np.ndarray
    w3_scale: np.ndarray
