"""The input sandbox: per-input value and shape limits, checked before a request is queued."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ortserve.errors import InvalidInput

__all__ = ["InputLimits", "InputSandbox"]

Array = npt.NDArray[np.generic]


@dataclass(frozen=True, slots=True)
class InputLimits:
    """What one input may hold (None: no limit)."""

    min: float | None = None
    max: float | None = None
    allow_nan: bool = True
    allow_inf: bool = True
    max_shape: tuple[int, ...] | None = None


class InputSandbox:
    """Refuses inputs outside their limits with a 400 naming the input, index and value.

    A model fed values it was never trained on (a 1e300, a NaN) answers garbage or non-finite
    numbers; refusing them at the door keeps both the batch and the answer sane. Checks are
    vectorised: one pass per limit over the array, and the offending index is only searched
    for once a check has failed.

    Args:
        limits: input name -> its limits (inputs not named are not checked).
    """

    def __init__(self, limits: Mapping[str, InputLimits]) -> None:
        self._limits = dict(limits)

    def check(self, feeds: Mapping[str, Array]) -> None:
        """Raises:
        InvalidInput: the first input breaking a limit, with its first offending element.
        """
        for name, limits in self._limits.items():
            array = feeds.get(name)
            if array is not None:
                _check_one(name, array, limits)


def _check_one(name: str, array: Array, limits: InputLimits) -> None:
    if limits.max_shape is not None:
        _check_shape(name, array.shape, limits.max_shape)
    kind = array.dtype.kind
    if kind not in "fiub" or array.size == 0:
        return
    values: npt.NDArray[np.floating[Any] | np.integer[Any]] = (
        array.astype(np.float64, copy=False) if kind == "b" else array  # type: ignore[assignment]
    )
    if _within(float(values.min()), float(values.max()), limits):
        return  # the common case: two reductions instead of a pass per limit
    if kind == "f":
        if not limits.allow_nan:
            _refuse_where(name, np.isnan(values), values, "NaN is not allowed")
        if not limits.allow_inf:
            _refuse_where(name, np.isinf(values), values, "infinity is not allowed")
    if limits.min is not None:
        below = values < limits.min
        _refuse_where(name, below, values, f"below the minimum {limits.min:g}")
    if limits.max is not None:
        above = values > limits.max
        _refuse_where(name, above, values, f"above the maximum {limits.max:g}")


def _within(lowest: float, highest: float, limits: InputLimits) -> bool:
    """Whether the extremes prove every element fine (a NaN makes both NaN: not proven)."""
    if lowest != lowest or highest != highest:  # NaN
        return False
    if limits.min is not None and not lowest >= limits.min:
        return False
    if limits.max is not None and not highest <= limits.max:
        return False
    return limits.allow_inf or (math.isfinite(lowest) and math.isfinite(highest))


def _check_shape(name: str, shape: tuple[int, ...], max_shape: tuple[int, ...]) -> None:
    if len(shape) != len(max_shape):
        raise InvalidInput(
            f"input {name!r}: shape {list(shape)} has rank {len(shape)}, max_shape {list(max_shape)} "
            f"has rank {len(max_shape)}"
        )
    for axis, (dim, most) in enumerate(zip(shape, max_shape, strict=True)):
        if dim > most:
            raise InvalidInput(
                f"input {name!r}: dimension {axis} is {dim}, at most {most} allowed (max_shape {list(max_shape)})"
            )


def _refuse_where(name: str, bad: npt.NDArray[np.bool_], values: Array, why: str) -> None:
    if not bad.any():
        return
    flat = int(np.flatnonzero(bad.reshape(-1))[0])
    index = [int(i) for i in np.unravel_index(flat, values.shape)]
    value = values.reshape(-1)[flat].item()
    raise InvalidInput(f"input {name!r}: element {index} is {value!r}: {why}")
