"""Tensor data on the wire: JSON ``data`` lists and raw binary buffers <-> NumPy arrays.

Every decoder checks the element count against the declared shape *before* anything of
that shape is allocated: a client may only make the server allocate what it actually sent.
Shared by the HTTP codec and the gRPC transport.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ortserve.core.datatypes import (
    BF16,
    BYTES,
    array_to_binary,
    bf16_from_float32,
    bf16_to_float32,
    numpy_dtype,
)
from ortserve.errors import InvalidInput

__all__ = [
    "MAX_RANK",
    "TensorLimits",
    "array_from_binary",
    "array_from_json",
    "array_to_binary",
    "array_to_json_data",
    "checked_shape",
    "element_count",
]

Array = npt.NDArray[np.generic]
_LENGTH = struct.Struct("<I")
_FLOAT_KINDS = "fiu"
_INT_KINDS = "iu"


MAX_RANK = 64


@dataclass(frozen=True, slots=True)
class TensorLimits:
    """Bounds on what one tensor may declare or carry."""

    max_elements: int = 64 * 1024 * 1024
    max_depth: int = 32
    max_bytes_element: int = 16 * 1024 * 1024
    max_object_elements: int = 1 << 18
    """Elements of a tensor that become Python objects one by one on the event loop (BYTES,
    and gRPC's typed contents): ~0.5 us each, so 2^18 is about 0.1 s of the loop. 15 million
    empty BYTES elements (60 KB deflated) held it 8 s; large tensors go as raw binary."""


def checked_shape(name: str, shape: object, limits: TensorLimits) -> tuple[int, ...]:
    """Validate a wire shape: a list of non-negative integers, bounded in rank and size."""
    if not isinstance(shape, (list, tuple)):
        raise InvalidInput(f"input {name!r}: 'shape' must be a list of integers")
    if len(shape) > MAX_RANK:
        raise InvalidInput(f"input {name!r}: rank {len(shape)} exceeds {MAX_RANK}")
    for dim in shape:
        if type(dim) is not int or dim < 0:
            raise InvalidInput(f"input {name!r}: shape {shape} must hold non-negative integers")
    dims = tuple(shape)
    # The extent without its zero dimensions: [2**32, 2**32, 0] holds no elements, but NumPy
    # and ONNX Runtime compute sizes in 64 bits and overflow on it, so it is bounded too.
    extent = math.prod(dim for dim in dims if dim)
    if extent > limits.max_elements:
        raise InvalidInput(
            f"input {name!r}: shape {list(dims)} exceeds the limit of {limits.max_elements} elements "
            "(dimensions other than 0 multiplied)"
        )
    return dims


def element_count(shape: tuple[int, ...]) -> int:
    """Elements in a shape, with Python integers so huge declarations cannot overflow."""
    return math.prod(shape)


def _flatten(name: str, data: list[Any], shape: tuple[int, ...], max_depth: int) -> list[Any]:
    """Flatten nested ``data`` whose nesting must follow ``shape`` exactly."""
    if len(shape) > max_depth:
        raise InvalidInput(f"input {name!r}: 'data' would be nested deeper than {max_depth}")
    flat: list[Any] = []

    def walk(items: list[Any], axis: int) -> None:
        if len(items) != shape[axis]:
            raise InvalidInput(
                f"input {name!r}: nested 'data' has {len(items)} items at dimension {axis}, "
                f"shape {list(shape)} needs {shape[axis]}"
            )
        if axis == len(shape) - 1:
            flat.extend(items)
            return
        for item in items:
            if not isinstance(item, list):
                raise InvalidInput(f"input {name!r}: nested 'data' does not follow shape {list(shape)}")
            walk(item, axis + 1)

    if not shape:
        raise InvalidInput(f"input {name!r}: nested 'data' for a scalar shape")
    walk(data, 0)
    return flat


def _bytes_array(name: str, flat: list[Any]) -> Array:
    out = np.empty(len(flat), dtype=object)
    for index, item in enumerate(flat):
        if not isinstance(item, str):
            raise InvalidInput(f"input {name!r}: BYTES data must be strings, found {type(item).__name__}")
        out[index] = item
    return out


def _numeric_array(name: str, flat: list[Any], datatype: str) -> Array:
    dtype = numpy_dtype(datatype)
    try:
        parsed = np.array(flat)
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidInput(f"input {name!r}: 'data' is not a list of numbers ({exc})") from None
    kind = parsed.dtype.kind
    if parsed.ndim != 1 and parsed.size:
        raise InvalidInput(f"input {name!r}: 'data' mixes lists and numbers")
    if not parsed.size:
        return np.empty(0, dtype=dtype)
    if dtype.kind == "b":
        if kind != "b":
            raise InvalidInput(f"input {name!r}: BOOL data must be true/false")
        return parsed
    if dtype.kind == "f" or datatype == BF16:
        if kind in "UO":  # "NaN", "Infinity", "-Infinity" as strict JSON writes them
            parsed = _named_non_finite(name, flat, datatype)
            kind = parsed.dtype.kind
        if kind not in _FLOAT_KINDS:
            raise InvalidInput(f"input {name!r}: {datatype} data must be numbers")
        if datatype == BF16:  # JSON carries the numbers; the server holds their bit patterns
            with np.errstate(over="ignore"):  # beyond float32 is beyond bfloat16: infinity
                return bf16_from_float32(parsed.astype(np.float32))
        return parsed.astype(dtype, copy=False)
    if kind not in _INT_KINDS:
        raise InvalidInput(f"input {name!r}: {datatype} data must be integers")
    info = np.iinfo(dtype)  # type: ignore[type-var]
    if int(parsed.min()) < info.min or int(parsed.max()) > info.max:
        raise InvalidInput(f"input {name!r}: a value is out of range for {datatype}")
    return parsed.astype(dtype, copy=False)


_NAMED_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _named_non_finite(name: str, flat: list[Any], datatype: str) -> Array:
    """Numbers, with the non-finite values spelled as strict JSON strings."""
    values = []
    for item in flat:
        if isinstance(item, str):
            found = _NAMED_FLOATS.get(item)
            if found is None:
                raise InvalidInput(
                    f'input {name!r}: {datatype} data must be numbers (or "NaN", "Infinity", '
                    f'"-Infinity"), found {item[:32]!r}'
                )
            values.append(found)
        elif isinstance(item, bool) or not isinstance(item, (int, float)):
            raise InvalidInput(f"input {name!r}: {datatype} data must be numbers")
        else:
            values.append(float(item))
    return np.array(values, dtype=np.float64)


def array_from_json(
    name: str, datatype: str, shape: tuple[int, ...], data: object, limits: TensorLimits
) -> Array:
    """A JSON ``data`` value (flat or nested, row-major) as an array of ``shape``."""
    if not isinstance(data, list):
        data = [data] if isinstance(data, (int, float, str, bool)) else None
        if data is None:
            raise InvalidInput(f"input {name!r}: 'data' must be a list")
    nested = bool(data) and isinstance(data[0], list)
    flat = _flatten(name, data, shape, limits.max_depth) if nested else data
    expected = element_count(shape)
    if len(flat) != expected:
        raise InvalidInput(
            f"input {name!r}: 'data' has {len(flat)} elements, shape {list(shape)} needs {expected}"
        )
    array = _bytes_array(name, flat) if datatype == BYTES else _numeric_array(name, flat, datatype)
    return array.reshape(shape)


def _split_bytes_elements(name: str, buffer: memoryview, count: int, limits: TensorLimits) -> Array:
    if count > limits.max_object_elements:
        raise InvalidInput(
            f"input {name!r}: {count} BYTES elements, at most {limits.max_object_elements} in one tensor"
        )
    size = len(buffer)
    # Every element has a 4-byte length: a shape the data cannot hold is refused before an
    # array of its declared size is made (a 40-byte request declaring 2^26 elements cost 512 MiB).
    if count > size // 4:
        raise InvalidInput(
            f"input {name!r}: {size} bytes of BYTES data hold at most {size // 4} elements, "
            f"the shape declares {count}"
        )
    out = np.empty(count, dtype=object)
    offset = 0
    for index in range(count):
        if offset + 4 > size:
            raise InvalidInput(f"input {name!r}: BYTES data ends inside element {index}'s length")
        (length,) = _LENGTH.unpack_from(buffer, offset)
        offset += 4
        if length > limits.max_bytes_element:
            raise InvalidInput(f"input {name!r}: BYTES element {index} is longer than the limit")
        if offset + length > size:
            raise InvalidInput(f"input {name!r}: BYTES element {index} runs past the end of its data")
        out[index] = bytes(buffer[offset : offset + length])
        offset += length
    if offset != size:
        raise InvalidInput(f"input {name!r}: {size - offset} bytes follow the last BYTES element")
    return out


def array_from_binary(
    name: str, datatype: str, shape: tuple[int, ...], buffer: memoryview, limits: TensorLimits
) -> Array:
    """Raw little-endian bytes (or length-prefixed BYTES elements) as a view of ``shape``."""
    count = element_count(shape)
    if datatype == BYTES:
        return _split_bytes_elements(name, buffer, count, limits).reshape(shape)
    dtype = numpy_dtype(datatype)
    expected = count * dtype.itemsize
    if len(buffer) != expected:
        raise InvalidInput(
            f"input {name!r}: {len(buffer)} bytes of binary data, shape {list(shape)} of "
            f"{datatype} needs {expected}"
        )
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


def _as_text(item: object) -> str:
    if isinstance(item, bytes):
        return item.decode("utf-8")
    return str(item)


def array_to_json_data(array: Array, datatype: str) -> object:
    """A row-major flat list (or an ndarray orjson writes natively) for a JSON ``data``.

    BF16 bit patterns are written as the numbers they stand for.
    """
    if datatype == BF16:
        return bf16_to_float32(array).reshape(-1)
    if array.dtype.kind == "O" or array.dtype.kind in "SU":
        try:
            return [_as_text(item) for item in array.reshape(-1)]
        except UnicodeDecodeError:
            raise InvalidInput("a BYTES output is not UTF-8 text; request it with binary_data") from None
    return np.ascontiguousarray(array).reshape(-1)
