"""The input sandbox: 400s naming the input, the first offending index and its value."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def test_a_limit_is_compared_exactly_not_rounded_to_the_input_type() -> None:
    """1e-50 rounds to 0.0 as a float32: the float32 0.0 is still below it (found by the
    property test below)."""
    with pytest.raises(InvalidInput, match="below the minimum 1e-50"):
        check(InputLimits(min=1e-50), np.zeros(2, dtype=np.float32))
    with pytest.raises(InvalidInput, match="above the maximum -1e-50"):
        check(InputLimits(max=-1e-50), np.zeros(2, dtype=np.float32))


def test_allowed_nan_does_not_hide_a_value_out_of_range() -> None:
    with pytest.raises(InvalidInput, match=r"element \[2\] is 20.0: above the maximum 10"):
        check(InputLimits(max=10), np.array([np.nan, 1.0, 20.0]))
    check(InputLimits(max=10), np.array([np.nan, 1.0, 2.0]))
    check(InputLimits(min=0, allow_nan=False), np.array([np.inf, 1.0]))


# -- the batch check: one proof for the batch, the exact check only when it fails ----------


@pytest.mark.parametrize(
    ("limits", "values"),
    [
        (InputLimits(min=-1, max=1), [0.0, 2.0]),
        (InputLimits(min=-1, max=1), [-1.5, 0.0]),
        (InputLimits(max=1), [0.0, np.nan, 0.5]),  # a NaN in the middle is its own extreme
        (InputLimits(allow_nan=False), [0.0, np.nan, 0.5]),
        (InputLimits(allow_inf=False), [0.0, -np.inf]),  # no min given: -inf is still refused
        (InputLimits(allow_inf=False), [np.inf, 0.0]),
    ],
)
def test_a_batch_breaking_a_limit_is_not_proven(limits: InputLimits, values: list[float]) -> None:
    array = np.array(values, dtype=np.float32)
    assert not InputSandbox({"x": limits}).passes({"x": array})


def test_a_batch_inside_every_limit_is_proven() -> None:
    sandbox = InputSandbox(
        {
            "x": InputLimits(min=-1, max=1, allow_nan=False, allow_inf=False),
            "n": InputLimits(min=0, max=65535),
            "b": InputLimits(max=1),
            "s": InputLimits(max=1),
        }
    )
    feeds: dict[str, np.ndarray] = {
        "x": np.array([[-1.0, 1.0], [0.5, 0.0]], dtype=np.float32),
        "n": np.array([0, 65535], dtype=np.int64),
        "b": np.array([True, False]),
        "s": np.array(["zzz"], dtype=object),  # not numeric: not checked
    }
    assert sandbox.passes(feeds)
    assert sandbox.passes({"x": np.zeros((0, 2), dtype=np.float32)})
    assert not sandbox.passes({"n": np.array([1, 70000], dtype=np.int64)})


def test_infinities_pass_where_allowed_and_nan_where_allowed_is_not_refused() -> None:
    sandbox = InputSandbox({"x": InputLimits()})
    assert sandbox.passes({"x": np.array([np.inf, -np.inf, np.nan])})  # no value limit at all
    allowed_nan = InputSandbox({"x": InputLimits(max=10)})
    with_nan = {"x": np.array([np.nan, 1.0])}
    assert not allowed_nan.passes(with_nan)  # not proven ...
    allowed_nan.check(with_nan)  # ... and not refused either


_LIMIT = st.one_of(st.none(), st.floats(-1e6, 1e6), st.sampled_from([0.0, 1.0, -1.0, 100.0, -100.0]))
_ELEMENT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.floats(-200.0, 200.0, width=32),
    st.sampled_from([100.0, -100.0, 0.0, np.nextafter(np.float32(100), np.float32(200))]),
)


@settings(max_examples=400, deadline=None)
@given(
    dtype=st.sampled_from([np.float32, np.float64]),
    values=st.lists(_ELEMENT, min_size=1, max_size=300),
    lowest=_LIMIT,
    highest=_LIMIT,
    allow_nan=st.booleans(),
    allow_inf=st.booleans(),
)
def test_the_batch_proof_agrees_with_the_exact_check(
    dtype: type,
    values: list[float],
    lowest: float | None,
    highest: float | None,
    allow_nan: bool,
    allow_inf: bool,
) -> None:
    """Whatever the values and limits: a batch proven fine has nothing the exact check refuses,
    and a batch without NaN is proven exactly when the exact check passes it."""
    sandbox = InputSandbox({"x": InputLimits(lowest, highest, allow_nan, allow_inf)})
    feeds: dict[str, np.ndarray] = {"x": np.array(values, dtype=dtype)}
    try:
        sandbox.check(feeds)
        refused = False
    except InvalidInput:
        refused = True
    proven = sandbox.passes(feeds)
    if proven:
        assert not refused
    if not np.isnan(feeds["x"]).any():
        assert proven == (not refused)


def test_shapes_are_checked_alone_before_queueing() -> None:
    sandbox = InputSandbox({"x": InputLimits(max=1, max_shape=(4, 2))})
    sandbox.check_shapes({"x": np.full((4, 2), 1e30)})  # values are the batch check's
    with pytest.raises(InvalidInput, match=r"dimension 0 is 5, at most 4 allowed"):
        sandbox.check_shapes({"x": np.zeros((5, 2))})


def test_the_sandbox_says_whether_it_limits_shapes() -> None:
    assert InputSandbox({"x": InputLimits(max_shape=(4, 2))}).limits_shapes
    assert not InputSandbox({"x": InputLimits(max=1)}).limits_shapes
