"""Checking a decoded request against the model's inputs before it may be queued."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ortserve.core.datatypes import numpy_dtype
from ortserve.core.types import InferInput, TensorSpec
from ortserve.errors import InvalidInput

__all__ = ["validate_inputs"]

Array = npt.NDArray[np.generic]


def _check_one(tensor: InferInput, spec: TensorSpec) -> Array:
    if tensor.datatype != spec.datatype:
        raise InvalidInput(
            f"input {tensor.name!r} has datatype {tensor.datatype}, the model expects {spec.datatype}"
        )
    shape = tensor.shape
    if len(shape) != len(spec.shape):
        raise InvalidInput(
            f"input {tensor.name!r} has rank {len(shape)} (shape {list(shape)}), the model expects "
            f"rank {len(spec.shape)} (shape {list(spec.shape)})"
        )
    for axis, (got, want) in enumerate(zip(shape, spec.shape)):
        if want >= 0 and got != want:
            raise InvalidInput(
                f"input {tensor.name!r} has {got} at dimension {axis}, the model expects {want} "
                f"(shape {list(spec.shape)})"
            )
    data = tensor.data
    if data.shape != shape or data.dtype != numpy_dtype(spec.datatype):
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


def validate_inputs(
    inputs: list[InferInput], specs: tuple[TensorSpec, ...], batched: bool
) -> tuple[dict[str, Array], int]:
    """Match inputs to the model's specs.

    Returns:
        The feeds for ONNX Runtime and the request's rows (its dim 0 when batched, else 1).

    Raises:
        InvalidInput: a missing, unknown or duplicated input, a wrong datatype, rank or fixed
            dimension, or inputs that disagree on the batch dimension.
    """
    by_name = {spec.name: spec for spec in specs}
    feeds: dict[str, Array] = {}
    for tensor in inputs:
        spec = by_name.get(tensor.name)
        if spec is None:
            raise InvalidInput(f"unexpected input {tensor.name!r}; the model's inputs are {sorted(by_name)}")
        if tensor.name in feeds:
            raise InvalidInput(f"input {tensor.name!r} is given more than once")
        feeds[tensor.name] = _check_one(tensor, spec)
    if len(feeds) != len(by_name):
        missing = sorted(set(by_name) - set(feeds))
        raise InvalidInput(f"missing inputs {missing}")
    feeds = {spec.name: feeds[spec.name] for spec in specs}  # one order, so batches line up
    if not batched:
        return feeds, 1
    rows = {array.shape[0] for array in feeds.values()}
    if len(rows) != 1:
        raise InvalidInput(f"inputs disagree on the batch dimension (dim 0): {sorted(rows)}")
    batch = rows.pop()
    if batch < 1:
        raise InvalidInput("the batch dimension (dim 0) must be at least 1")
    return feeds, batch
