"""Open Inference Protocol datatypes and their NumPy / ONNX Runtime equivalents."""

from __future__ import annotations

from typing import Final

import numpy as np

from ortserve.errors import InvalidInput

__all__ = [
    "BYTES",
    "NUMPY_BY_DATATYPE",
    "datatype_of_numpy",
    "datatype_of_ort",
    "itemsize",
    "numpy_dtype",
]

BYTES: Final = "BYTES"

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
    dtype: name for name, dtype in NUMPY_BY_DATATYPE.items() if name != BYTES
}


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


def datatype_of_ort(ort_type: str) -> str:
    """The OIP datatype of an ONNX Runtime type string such as ``tensor(float)``."""
    datatype = _DATATYPE_BY_ORT.get(ort_type)
    if datatype is None:
        raise ValueError(f"ONNX type {ort_type} has no Open Inference Protocol datatype")
    return datatype


def datatype_of_numpy(dtype: np.dtype[np.generic]) -> str:
    """The OIP datatype of an array produced by ONNX Runtime or a pipeline."""
    if dtype.kind in "OSU":
        return BYTES
    datatype = _DATATYPE_BY_NUMPY.get(dtype)
    if datatype is None:
        raise ValueError(f"NumPy dtype {dtype} has no Open Inference Protocol datatype")
    return datatype
