"""Checking a decoded request against the model's inputs before it may be queued."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from ortserve.core.datatypes import numpy_dtype
from ortserve.core.types import InferInput, TensorSpec
from ortserve.errors import InvalidInput

__all__ = ["InputValidator", "validate_inputs"]

Array = npt.NDArray[np.generic]

#: How much of a client-given name, and how many of a model's names, an error message shows: a
#: refusal is O(1) in what the client sent and in the model's size (a graph may have thousands of
#: inputs; a name may be as long as the body allows).
_NAME_CHARS = 64
_NAMES_SHOWN = 8


def _clipped(name: str) -> str:
    """A client-given name as an error message quotes it, at most ``_NAME_CHARS`` long."""
    if len(name) <= _NAME_CHARS:
        return repr(name)
    return f"{name[:_NAME_CHARS]!r}... ({len(name)} characters)"


def _listed(names: list[str]) -> str:
    """The first ``_NAMES_SHOWN`` of the model's sorted names, and how many more there are."""
    shown = sorted(names)[:_NAMES_SHOWN]
    more = len(names) - len(shown)
    return f"{shown}" if not more else f"{shown} and {more} more"


class _Expected:
    """One declared input, with what validation needs precomputed once per version."""

    __slots__ = ("dtype", "fixed", "rank", "spec")

    def __init__(self, spec: TensorSpec) -> None:
        self.spec = spec
        self.dtype = numpy_dtype(spec.datatype)
        self.rank = len(spec.shape)
        self.fixed = tuple((axis, dim) for axis, dim in enumerate(spec.shape) if dim >= 0)

    def check(self, tensor: InferInput) -> Array:
        spec = self.spec
        if tensor.datatype != spec.datatype:
            raise InvalidInput(
                f"input {tensor.name!r} has datatype {tensor.datatype}, the model expects {spec.datatype}"
            )
        shape = tensor.shape
        if len(shape) != self.rank:
            raise InvalidInput(
                f"input {tensor.name!r} has rank {len(shape)} (shape {list(shape)}), the model expects "
                f"rank {self.rank} (shape {list(spec.shape)})"
            )
        for axis, want in self.fixed:
            if shape[axis] != want:
                raise InvalidInput(
                    f"input {tensor.name!r} has {shape[axis]} at dimension {axis}, the model expects "
                    f"{want} (shape {list(spec.shape)})"
                )
        data = tensor.data
        if data.shape != shape or data.dtype != self.dtype:
            raise InvalidInput(f"input {tensor.name!r}: data does not match its declared shape or datatype")
        if not data.flags.c_contiguous:
            data = np.ascontiguousarray(data)
        if spec.datatype == "BYTES":
            data = _as_text(tensor.name, data)
        return data


def _as_text(name: str, data: Array) -> Array:
    """ONNX string tensors hold text: binary BYTES elements must be UTF-8 and become str."""
    out = np.empty(data.shape, dtype=object)
    flat_in = data.reshape(-1)
    flat_out = out.reshape(-1)
    for index, item in enumerate(flat_in.tolist()):
        if isinstance(item, bytes):
            try:
                flat_out[index] = item.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidInput(f"input {name!r}: BYTES element {index} is not UTF-8 text") from None
        else:
            flat_out[index] = item
    return out


class InputValidator:
    """Matches requests to one version's declared inputs (built once, used per request).

    Args:
        specs: the model's inputs in graph order.
        batched: whether dim 0 is the batch dimension.
        defaults: optional inputs and the value given when a request omits one (one row,
            repeated for each of the request's rows, when batched).
    """

    __slots__ = ("_batched", "_defaults", "_expected", "_listing", "_order")

    def __init__(
        self, specs: tuple[TensorSpec, ...], batched: bool, defaults: Mapping[str, Array] | None = None
    ) -> None:
        self._expected = {spec.name: _Expected(spec) for spec in specs}
        self._listing = _listed([spec.name for spec in specs])  # what an unknown name is told
        self._order = tuple(spec.name for spec in specs)
        self._batched = batched
        self._defaults = dict(defaults or {})

    def validate(self, inputs: list[InferInput]) -> tuple[dict[str, Array], int]:
        """Check every input against its declaration.

        Returns:
            The feeds for ONNX Runtime in graph order, and the request's rows (its dim 0 when
            batched, else 1).

        Raises:
            InvalidInput: a missing, unknown or duplicated input, a wrong datatype, rank or
                fixed dimension, or inputs that disagree on the batch dimension.
        """
        expected = self._expected
        checked: dict[str, Array] = {}
        for tensor in inputs:
            declared = expected.get(tensor.name)
            if declared is None:
                raise InvalidInput(
                    f"unexpected input {_clipped(tensor.name)}; the model's inputs are {self._listing}"
                )
            if tensor.name in checked:
                raise InvalidInput(f"input {tensor.name!r} is given more than once")  # a declared name
            checked[tensor.name] = declared.check(tensor)
        if len(checked) != len(expected):
            self._fill_defaults(checked)
        feeds = checked if len(checked) == 1 else {name: checked[name] for name in self._order}
        if not self._batched:
            return feeds, 1
        arrays = iter(feeds.values())
        rows = next(arrays).shape[0]
        for array in arrays:
            if array.shape[0] != rows:
                found = sorted({a.shape[0] for a in feeds.values()})
                raise InvalidInput(f"inputs disagree on the batch dimension (dim 0): {found}")
        if rows < 1:
            raise InvalidInput("the batch dimension (dim 0) must be at least 1")
        return feeds, rows

    def _fill_defaults(self, checked: dict[str, Array]) -> None:
        """Give omitted optional inputs their defaults (the slow path: only when one is missing).

        Raises:
            InvalidInput: a required input is missing.
        """
        missing = set(self._expected) - set(checked)
        required = list(missing - set(self._defaults))
        if required:
            raise InvalidInput(f"missing inputs {_listed(required)}")
        rows = next(iter(checked.values())).shape[0] if checked and self._batched else 1
        for name in missing:
            default = self._defaults[name]
            checked[name] = np.repeat(default, rows, axis=0) if self._batched else default


def validate_inputs(
    inputs: list[InferInput], specs: tuple[TensorSpec, ...], batched: bool
) -> tuple[dict[str, Array], int]:
    """One-off validation (tests, tools); servers keep an :class:`InputValidator`."""
    return InputValidator(specs, batched).validate(inputs)
