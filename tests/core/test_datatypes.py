"""The datatype table and the BF16 <-> float32 conversions (exact bit patterns)."""

from __future__ import annotations

import ml_dtypes  # a dependency of onnx: an independent bfloat16 implementation to check against
import numpy as np
import pytest

from ortserve.core.datatypes import (
    bf16_from_float32,
    bf16_to_float32,
    datatype_of_numpy,
    datatype_of_ort,
    itemsize,
    numpy_dtype,
)


def float32_of_bits(bits: int) -> np.float32:
    return np.float32(np.array([bits], dtype=np.uint32).view(np.float32)[0])


def test_bf16_is_carried_as_uint16_and_uint16_arrays_still_read_as_uint16() -> None:
    assert numpy_dtype("BF16") == np.dtype(np.uint16)
    assert itemsize("BF16") == 2
    assert datatype_of_ort("tensor(bfloat16)") == "BF16"
    assert datatype_of_numpy(np.dtype(np.uint16)) == "UINT16"


@pytest.mark.parametrize(
    ("value_bits", "expected"),
    [
        (0x3F800000, 0x3F80),  # 1.0
        (0xC0000000, 0xC000),  # -2.0
        (0x00000000, 0x0000),  # +0
        (0x80000000, 0x8000),  # -0 keeps its sign
        (0x3DCCCCCD, 0x3DCD),  # 0.1: dropped half above one half rounds up
        (0x3F808000, 0x3F80),  # exactly half, kept half even: stays
        (0x3F818000, 0x3F82),  # exactly half, kept half odd: rounds up to even
        (0x3F808001, 0x3F81),  # just above half: rounds up
        (0x3F807FFF, 0x3F80),  # just below half: rounds down
        (0x7F7FFFFF, 0x7F80),  # float32 max overflows to +inf
        (0xFF7FFFFF, 0xFF80),  # and -max to -inf
        (0x7F800000, 0x7F80),  # +inf
        (0xFF800000, 0xFF80),  # -inf
        (0x00000001, 0x0000),  # smallest subnormal rounds to zero
        (0x7FC00000, 0x7FC0),  # quiet NaN
        (0x7F800001, 0x7FC0),  # a NaN whose payload is all in the dropped half stays NaN
        (0xFFFFFFFF, 0xFFC0),  # negative NaN: carry would wrap, sign is kept
    ],
)
def test_float32_to_bf16_rounds_to_nearest_even(value_bits: int, expected: int) -> None:
    got = bf16_from_float32(np.array([float32_of_bits(value_bits)]))
    assert got.dtype == np.uint16
    assert int(got[0]) == expected


def test_float32_to_bf16_matches_ml_dtypes_on_random_bit_patterns() -> None:
    bits = np.random.default_rng(0).integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    values = bits.view(np.float32).reshape(400, 500)
    with np.errstate(invalid="ignore"):  # ml_dtypes warns when it casts NaN
        reference = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    got = bf16_from_float32(values)
    assert got.shape == (400, 500)
    np.testing.assert_array_equal(got, reference)


def test_bf16_to_float32_shifts_the_bits_into_the_upper_half() -> None:
    bits = np.array([[0x3F80, 0xC040], [0x7F80, 0x7FC0]], dtype=np.uint16)
    values = bf16_to_float32(bits)
    assert values.dtype == np.float32 and values.shape == (2, 2)
    np.testing.assert_array_equal(values.view(np.uint32), bits.astype(np.uint32) << 16)
    assert values[0, 0] == 1.0 and values[0, 1] == -3.0 and values[1, 0] == np.inf
    assert np.isnan(values[1, 1])


def test_every_bf16_survives_a_round_trip_through_float32() -> None:
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    back = bf16_from_float32(bf16_to_float32(bits))
    nan = np.isnan(bf16_to_float32(bits))
    np.testing.assert_array_equal(back[~nan], bits[~nan])
    assert set(np.unique(back[nan]).tolist()) == {0x7FC0, 0xFFC0}


def test_scalars_and_python_numbers_convert() -> None:
    assert int(bf16_from_float32(1.0)) == 0x3F80
    assert float(bf16_to_float32(np.uint16(0x4049))) == 3.140625
