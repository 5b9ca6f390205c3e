"""Open Inference Protocol datatypes and their NumPy / ONNX Runtime equivalents.

BF16 has no NumPy dtype. Inside the server a BF16 tensor is a ``uint16`` array holding the
raw bfloat16 bit patterns (the upper half of the float32 with the same sign and exponent):
the binary wire forms carry exactly those 2 bytes per element, little-endian, as Triton does,
and ONNX Runtime is handed them through OrtValues (``core/ortvalues.py``). Only JSON sees
numbers: :func:`bf16_from_float32` and :func:`bf16_to_float32` convert at that edge. So a
``uint16`` array alone does not say whether it is UINT16 or BF16; the datatype travels with
it (request, model metadata), and :func:`datatype_of_numpy` always answers UINT16.
"""

from __future__ import annotations

import struct
from typing import Final

import numpy as np
import numpy.typing as npt

from ortserve.errors import InvalidInput

__all__ = [
    "BF16",
    "BYTES",
    "NUMPY_BY_DATATYPE",
    "array_to_binary",
    "bf16_from_float32",
    "bf16_to_float32",
    "datatype_of_numpy",
    "datatype_of_ort",
    "itemsize",
    "numpy_dtype",
]

BYTES: Final = "BYTES"
BF16: Final = "BF16"

NUMPY_BY_DATATYPE: Final[dict[str, np.dtype[np.generic]]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    # bfloat16 bit patterns (see the module docstring): NumPy has no bfloat16.
    "BF16": np.dtype(np.uint16),
    # BYTES elements are Python bytes/str objects; ONNX Runtime takes object arrays.
    "BYTES": np.dtype(np.object_),
}

_DATATYPE_BY_ORT: Final[dict[str, str]] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
    "tensor(bfloat16)": "BF16",
}

_DATATYPE_BY_NUMPY: Final[dict[np.dtype[np.generic], str]] = {
    dtype: name for name, dtype in NUMPY_BY_DATATYPE.items() if name not in (BYTES, BF16)
}

_LENGTH: Final = struct.Struct("<I")

# Sign-preserving quiet NaNs, as ml_dtypes / Eigen write a float32 NaN in bfloat16.
_BF16_NAN: Final = np.uint32(0x7FC0)
_BF16_NEGATIVE_NAN: Final = np.uint32(0xFFC0)


def numpy_dtype(datatype: str) -> np.dtype[np.generic]:
    """The NumPy dtype that carries an OIP datatype.

    Raises:
        InvalidInput: the datatype is not one this server carries.
    """
    dtype = NUMPY_BY_DATATYPE.get(datatype)
    if dtype is None:
        raise InvalidInput(f"unsupported datatype {datatype!r}")
    return dtype


def itemsize(datatype: str) -> int:
    """Bytes per element in the binary wire format (0 for variable-size BYTES)."""
    if datatype == BYTES:
        return 0
    return numpy_dtype(datatype).itemsize


def datatype_of_ort(ort_type: str, name: str = "") -> str:
    """The OIP datatype of an ONNX Runtime type string such as ``tensor(float)``.

    Raises:
        ValueError: no datatype carries it (the message names ``name`` and, for the common
            cases such as skl2onnx's ZipMap, what to do: core/model_hints.py).
    """
    datatype = _DATATYPE_BY_ORT.get(ort_type)
    if datatype is None:
        from ortserve.core.model_hints import unsupported_type_hint

        where = f"{name!r}: " if name else ""
        raise ValueError(
            f"{where}ONNX type {ort_type} has no Open Inference Protocol datatype{unsupported_type_hint(ort_type)}"
        )
    return datatype


def datatype_of_numpy(dtype: np.dtype[np.generic]) -> str:
    """The OIP datatype of an array produced by ONNX Runtime or a pipeline."""
    if dtype.kind in "OSU":
        return BYTES
    datatype = _DATATYPE_BY_NUMPY.get(dtype)
    if datatype is None:
        raise ValueError(f"NumPy dtype {dtype} has no Open Inference Protocol datatype")
    return datatype


def bf16_from_float32(values: npt.ArrayLike) -> npt.NDArray[np.uint16]:
    """bfloat16 bit patterns of float32 values, rounded to nearest, ties to even.

    Values are first taken as float32. Overflow rounds to infinity; every NaN becomes a
    quiet NaN of the same sign (plain truncation could turn a NaN into an infinity).
    """
    floats = np.asarray(values, dtype=np.float32)
    bits = floats.reshape(-1).view(np.uint32)  # 1-D: array arithmetic wraps without a warning
    # Adding 0x7FFF, plus 1 when the kept half is odd, carries into bit 16 exactly when the
    # dropped half is above one half, or exactly one half next to an odd kept half.
    rounded = (bits + ((bits >> 16) & 1) + np.uint32(0x7FFF)) >> 16
    nan = np.isnan(floats.reshape(-1))
    if nan.any():
        rounded[nan] = np.where(bits[nan] >> 31, _BF16_NEGATIVE_NAN, _BF16_NAN)
    return rounded.astype(np.uint16).reshape(floats.shape)


def bf16_to_float32(bits: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """float32 values of bfloat16 bit patterns held as uint16 (exact: they become the upper half)."""
    wide = np.asarray(bits, dtype=np.uint16).astype(np.uint32)
    np.left_shift(wide, 16, out=wide)
    return wide.view(np.float32)


def array_to_binary(array: npt.NDArray[np.generic]) -> list[bytes | memoryview]:
    """Buffers that, concatenated, are the tensor's binary form (wire and shared memory).

    Fixed-size elements are the little-endian bytes of the array; BYTES elements are each a
    4-byte little-endian length followed by the element.
    """
    if array.dtype.kind in "OSU":
        chunks: list[bytes | memoryview] = []
        for item in array.reshape(-1):
            raw = item if isinstance(item, bytes) else str(item).encode("utf-8")
            chunks.append(_LENGTH.pack(len(raw)))
            chunks.append(raw)
        return chunks
    contiguous = np.ascontiguousarray(array)
    if contiguous.dtype.byteorder == ">":
        contiguous = contiguous.astype(contiguous.dtype.newbyteorder("<"))
    return [memoryview(contiguous).cast("B")]  # type: ignore[arg-type]
