"""The input sandbox: per-input value and shape limits, shapes per request, values per batch."""

from __future__ import annotations

import math
import sys
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
    numbers; refusing them at the door keeps both the batch and the answer sane.

    Two checks, because one request's values are cheap to check only as part of a batch: a
    NumPy call costs a few microseconds of overhead whatever the array's size, as much as a
    small model's whole share of a batch run. :meth:`check_shapes` (no NumPy call) runs for
    each request before it is queued; :meth:`passes` proves a whole assembled batch fine with
    two calls per input (the extremes, ``argmin``/``argmax``: a NaN is its own extreme, so it
    shows), and only a batch it cannot prove is checked request by request with :meth:`check`,
    which names the first offending element (the scheduler refuses those requests and runs the
    rest).

    Args:
        limits: input name -> its limits (inputs not named are not checked).
    """

    def __init__(self, limits: Mapping[str, InputLimits]) -> None:
        self._limits = dict(limits)
        self._shapes = tuple(
            (n, lim.max_shape) for n, lim in self._limits.items() if lim.max_shape is not None
        )
        self._bounds = tuple((n, *_bounds(lim)) for n, lim in self._limits.items() if _limits_values(lim))

    @property
    def limits_shapes(self) -> bool:
        """Whether any input has a ``max_shape`` (else :meth:`check_shapes` has nothing to do)."""
        return bool(self._shapes)

    def check_shapes(self, feeds: Mapping[str, Array]) -> None:
        """The ``max_shape`` limits of one request.

        Raises:
            InvalidInput: an input with more dimensions, or longer ones, than allowed.
        """
        for name, max_shape in self._shapes:
            array = feeds.get(name)
            if array is not None:
                _check_shape(name, array.shape, max_shape)

    def passes(self, feeds: Mapping[str, Array]) -> bool:
        """Whether the value limits hold for every element (any batch of requests' feeds).

        False only says "not proven": a NaN where NaN is allowed also makes it False, and
        :meth:`check` then finds nothing to refuse.
        """
        for name, lowest, highest in self._bounds:
            array = feeds.get(name)
            if array is None or not array.size or array.dtype.kind not in _NUMERIC:
                continue
            # A NaN is both extremes and compares false: not proven.
            if not (lowest <= array.item(array.argmin()) and array.item(array.argmax()) <= highest):
                return False
        return True

    def check(self, feeds: Mapping[str, Array]) -> None:
        """Every limit of one request's feeds.

        Raises:
            InvalidInput: the first input breaking a limit, with its first offending element.
        """
        for name, limits in self._limits.items():
            array = feeds.get(name)
            if array is not None:
                _check_one(name, array, limits)


_NUMERIC = "fiub"
_FINITE_MAX = sys.float_info.max


def _limits_values(limits: InputLimits) -> bool:
    return not (limits.min is None and limits.max is None and limits.allow_nan and limits.allow_inf)


def _bounds(limits: InputLimits) -> tuple[float, float]:
    """The closed interval every element must lie in (infinities outside it when refused)."""
    lowest = -math.inf if limits.min is None else limits.min
    highest = math.inf if limits.max is None else limits.max
    if not limits.allow_inf:
        lowest, highest = max(lowest, -_FINITE_MAX), min(highest, _FINITE_MAX)
    return lowest, highest


def _check_one(name: str, array: Array, limits: InputLimits) -> None:
    if limits.max_shape is not None:
        _check_shape(name, array.shape, limits.max_shape)
    kind = array.dtype.kind
    if kind not in _NUMERIC or array.size == 0:
        return
    values: npt.NDArray[np.floating[Any] | np.integer[Any]] = (
        array.astype(np.float64, copy=False) if kind == "b" else array  # type: ignore[assignment]
    )
    if kind == "f":
        if not limits.allow_nan:
            _refuse_where(name, np.isnan(values), values, "NaN is not allowed")
        if not limits.allow_inf:
            _refuse_where(name, np.isinf(values), values, "infinity is not allowed")
    # The limits as float64 scalars: a plain float would be rounded to the array's own type
    # first (NEP 50), and a float32 0.0 would pass a minimum of 1e-50.
    if limits.min is not None:
        below = values < np.float64(limits.min)
        _refuse_where(name, below, values, f"below the minimum {limits.min:g}")
    if limits.max is not None:
        above = values > np.float64(limits.max)
        _refuse_where(name, above, values, f"above the maximum {limits.max:g}")


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
