"""MXFP4: real released bytes decode bit for bit; nibble order matters; quantise round-trips."""
import json

import numpy as np

from k3core.format import mxfp4
from k3core.interfaces import Param
from k3core.plugins.reference_kernels import ReferenceKernels

from ..conftest import K3_IN_C


def real_expert_rows():
    d = json.loads((K3_IN_C / "mxfp4.json").read_text())
    packed = np.array(d["packed"]["data"], np.uint8).reshape(d["packed"]["shape"])
    scales = np.array(d["scales"]["data"], np.uint8).reshape(d["scales"]["shape"])
    expected = np.array(d["expected"]["data"], np.float32).reshape(d["expected"]["shape"])
    swapped = np.array(d["expected_swapped_nibbles"]["first64"], np.float32)
    return packed, scales, expected, swapped


def test_real_released_bytes_decode_bit_for_bit():
    packed, scales, expected, _ = real_expert_rows()
    assert np.array_equal(mxfp4.decode(packed, scales).view(np.uint32), expected.view(np.uint32))


def test_real_bytes_are_not_the_swapped_nibble_decode():
    packed, scales, _, swapped = real_expert_rows()
    decoded = mxfp4.decode(packed, scales).ravel()[:64]
    assert not np.array_equal(decoded, swapped)
    swapped_ours = mxfp4.decode(((packed << 4) | (packed >> 4)).astype(np.uint8), scales).ravel()[:64]
    assert np.array_equal(swapped_ours, swapped)


def test_matvec_from_packed_bytes_equals_the_decoded_product():
    packed, scales, expected, _ = real_expert_rows()
    x = np.random.RandomState(1).standard_normal((2, expected.shape[1])).astype(np.float32)
    kr = ReferenceKernels()
    from_packed = kr.mxfp4_linear(packed, scales, x)
    from_decoded = kr.linear(Param(expected, "F32"), x)
    assert np.array_equal(from_packed.view(np.uint32), from_decoded.view(np.uint32))


def test_scale_byte_255_makes_the_group_zero():
    packed = np.full((1, 32), 0x77, np.uint8)  # every element code 7 = 6.0
    scale = np.array([[127, 255]], np.uint8)
    values = mxfp4.decode(packed, scale)
    assert np.all(values[0, :32] == 6.0) and np.all(values[0, 32:] == 0.0)
    assert mxfp4.count_nan_scales(scale) == 1


def test_quantise_follows_the_spec_recipe_and_round_trips_representable_values():
    _, _, expected, _ = real_expert_rows()
    packed, scale = mxfp4.quantize(expected)
    assert np.array_equal(mxfp4.decode(packed, scale), expected)
    w = np.array([[0.3] + [0.0] * 31], np.float32)  # max 0.3: e = floor(log2 0.3) - 2 = -4
    p, s = mxfp4.quantize(w)
    assert s[0, 0] == 127 - 4 and (p[0, 0] & 0x0F) == 6  # 0.3 / 2^-4 = 4.8 -> nearest code 4.0 (6)
