"""MXFP4 (MODEL.md §5): E2M1 nibbles, one E8M0 scale byte per 32 inputs; decode and quantise.

Decoding whole tensors is for tests and tools; the engine multiplies from packed bytes.
"""
from __future__ import annotations

import numpy as np

GROUP = 32
# Codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign.
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float64)
NAN_SCALE = 255  # OCP's NaN scale: the group counts as zeros


def scale_multipliers(scale: np.ndarray) -> np.ndarray:
    """2^(byte − 127) as float64; byte 255 gives 0 (the group is zero)."""
    mult = np.ldexp(1.0, scale.astype(np.int32) - 127)
    return np.where(scale == NAN_SCALE, 0.0, mult)


def decode(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Dequantise [rows, in/2] nibbles + [rows, in/32] scales to float32 [rows, in]."""
    if scale.shape[1] * GROUP != packed.shape[1] * 2:
        raise ValueError(f"scale columns {scale.shape[1]} × 32 != packed columns {packed.shape[1]} × 2")
    codes = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.uint8)
    codes[:, 0::2] = packed & 0x0F  # element 2k: LOW nibble
    codes[:, 1::2] = packed >> 4    # element 2k+1: HIGH nibble
    values = E2M1[codes] * np.repeat(scale_multipliers(scale), GROUP, axis=1)
    return values.astype(np.float32)


def count_nan_scales(scale: np.ndarray) -> int:
    return int(np.count_nonzero(scale == NAN_SCALE))


def quantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MODEL.md §5 recipe: per group e = floor(log2(max|w|)) − 2, nibble = nearest E2M1 of w/2^e.

    Ties go to the smaller magnitude. An all-zero group gets scale byte 127 and zero codes."""
    rows, cols = w.shape
    if cols % GROUP:
        raise ValueError(f"MXFP4 input width {cols} is not a multiple of {GROUP}")
    groups = w.astype(np.float64).reshape(rows, cols // GROUP, GROUP)
    peak = np.abs(groups).max(axis=2)
    e = np.where(peak > 0, np.floor(np.log2(np.where(peak > 0, peak, 1.0))) - 2, 0).astype(np.int32)
    scaled = groups / np.ldexp(1.0, e)[:, :, None]
    midpoints = (E2M1[:7] + E2M1[1:8]) / 2
    idx = np.searchsorted(midpoints, np.abs(scaled), side="left")  # a tie goes to the smaller magnitude
    codes = (idx | np.where((scaled < 0) & (idx > 0), 8, 0)).astype(np.uint8).reshape(rows, cols)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed, (e + 127).astype(np.uint8)
