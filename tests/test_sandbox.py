"""The input sandbox: 400s naming the input, the first offending index and its value."""

from __future__ import annotations

import numpy as np
import pytest

from ortserve.core.sandbox import InputLimits, InputSandbox
from ortserve.errors import InvalidInput


def check(limits: InputLimits, array: np.ndarray) -> None:
    InputSandbox({"x": limits}).check({"x": array})


def test_values_inside_every_limit_pass() -> None:
    check(InputLimits(min=-1, max=1, allow_nan=False, allow_inf=False, max_shape=(4, 2)), np.zeros((4, 2)))


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (InputLimits(max=10), "input 'x': element [1, 0] is 1e+300: above the maximum 10"),
        (InputLimits(min=0), "input 'x': element [0, 1] is -2.0: below the minimum 0"),
        (InputLimits(allow_nan=False), "input 'x': element [1, 1] is nan: NaN is not allowed"),
        (InputLimits(allow_inf=False), "input 'x': element [2, 0] is inf: infinity is not allowed"),
    ],
)
def test_the_first_offending_element_is_named(limits: InputLimits, message: str) -> None:
    data = np.array([[0.0, -2.0], [1e300, np.nan], [np.inf, 0.0]])
    with pytest.raises(InvalidInput) as caught:
        check(limits, data)
    assert caught.value.message == message


def test_integer_inputs_are_range_checked() -> None:
    with pytest.raises(InvalidInput, match=r"element \[2\] is 70000: above the maximum 65535"):
        check(InputLimits(min=0, max=65535), np.array([1, 2, 70000], dtype=np.int64))


def test_max_shape_bounds_each_dimension() -> None:
    with pytest.raises(InvalidInput, match=r"dimension 1 is 9, at most 8 allowed"):
        check(InputLimits(max_shape=(64, 8)), np.zeros((2, 9), dtype=np.float32))
    with pytest.raises(InvalidInput, match="has rank 1"):
        check(InputLimits(max_shape=(64, 8)), np.zeros(3, dtype=np.float32))


def test_inputs_without_limits_and_strings_are_not_checked() -> None:
    sandbox = InputSandbox({"x": InputLimits(max=1)})
    sandbox.check({"other": np.array([1e30])})
    check(InputLimits(max=1), np.array(["zzz"], dtype=object))


def test_allowed_nan_does_not_hide_a_value_out_of_range() -> None:
    with pytest.raises(InvalidInput, match=r"element \[2\] is 20.0: above the maximum 10"):
        check(InputLimits(max=10), np.array([np.nan, 1.0, 20.0]))
    check(InputLimits(max=10), np.array([np.nan, 1.0, 2.0]))
    check(InputLimits(min=0, allow_nan=False), np.array([np.inf, 1.0]))
