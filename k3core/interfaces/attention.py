"""The attention backend kind: one attention (KDA, MLA) for the layers the config gives it, and its decode
state."""
from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence

import numpy as np

from .base import Plugin
from .tensors import TensorSpec, Weights

if TYPE_CHECKING:
    from ..format.config import Config
    from .kernels import KernelBackend


class AttentionBackend(Plugin):
    """One attention kind for the layers the config gives it (`config.attention_kind(layer)`)."""

    kind: ClassVar[str]
    # Names among state_arrays whose first axis is the position (MLA's cached keys): the prompt cache keeps their
    # rows once per position, shared by every kept prefix through it; any other array is kept whole per checkpoint.
    positional: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def tensor_specs(self, config: Config, layer: int) -> list[TensorSpec]:
        """Tensors this backend reads, named relative to `layers.{layer}.`."""

    @abstractmethod
    def new_state(self, config: Config, layer: int) -> Any:
        """The empty decode state of a layer (it must support copy.deepcopy)."""

    @abstractmethod
    def state_bytes(self, config: Config, layer: int, context: int) -> int:
        """Bytes the decode state of `layer` holds after `context` positions (for the memory plan)."""

    @abstractmethod
    def forward(self, w: Weights, x: np.ndarray, state: Any, config: Config, kernels: KernelBackend) -> np.ndarray:
        """Consume T new tokens x [T, H] (already input_layernorm-ed), advancing `state` (the engine calls this
        when a pass carries one sequence, forward_batch when it carries several)."""

    def forward_batch(self, w: Weights, x: np.ndarray, segments: Sequence[tuple[int, int, Any]], config: Config,
                      kernels: KernelBackend) -> np.ndarray:
        """Several sequences in one pass: `segments` lists (start, stop, state), the rows of x [T, H] each
        sequence owns, in order and covering x. Returns [T, H], each segment's rows exactly what `forward`
        gives it alone. This default runs `forward` per segment; a backend may share its projections over
        all rows instead (kernels give a row the same bits in any batch)."""
        return np.concatenate([self.forward(w, x[a:b], state, config, kernels) for a, b, state in segments])

    def mark(self, state: Any) -> None:
        """Remember where `state` stands, so that `rollback` can return it to any position forwarded after
        this (speculative decoding verifies drafted ids, then keeps only the accepted ones)."""
        raise NotImplementedError(f"attention backend {self.name!r} cannot roll back its decode state, which "
                                  "speculative decoding (--speculate) needs")

    def rollback(self, state: Any, kept: int, config: Config, kernels: KernelBackend) -> None:
        """Make `state` hold the marked position plus the first `kept` positions forwarded since, bit for bit
        as if only those had been forwarded; the mark is then gone (`kept` = all of them just drops it)."""
        raise NotImplementedError(f"attention backend {self.name!r} cannot roll back its decode state")

    def rollback_bytes(self, config: Config, layer: int, positions: int) -> int:
        """Bytes a mark holds while `positions` positions are forwarded after it (for the memory plan)."""
        raise NotImplementedError(f"attention backend {self.name!r} cannot roll back its decode state")

    def keep_at(self, state: Any, positions: Sequence[int]) -> None:
        """Before a forward of `state`: keep its arrays that are not `positional` as they stand after each of
        `positions` of the rows that forward brings (0 < p < rows), for `kept` to hand out — what the prompt cache
        keeps at a checkpoint inside a pass, which is not cut there (a pass of the real model reads its weights)."""
        raise NotImplementedError(f"attention backend {self.name!r} cannot keep its state inside a pass, which the "
                                  "prompt cache needs (--prompt-cache-gb 0 --prompt-cache off runs without it)")

    def kept(self, state: Any) -> dict[int, dict[str, np.ndarray]]:
        """What `keep_at` asked for, by position, after the forward; handed out once."""
        raise NotImplementedError(f"attention backend {self.name!r} cannot keep its state inside a pass")

    def state_arrays(self, state: Any) -> dict[str, np.ndarray]:
        """The state as named arrays, for state files (chat /save) and the prompt cache; the arrays may be views
        of the state's own (callers copy what they keep)."""
        raise NotImplementedError(f"attention backend {self.name!r} cannot save its decode state")

    def state_from_arrays(self, config: Config, layer: int, arrays: Mapping[str, np.ndarray]) -> Any:
        """The inverse of state_arrays."""
        raise NotImplementedError(f"attention backend {self.name!r} cannot load a decode state")
