"""Request payloads for load: generated from a model's metadata or read from .npz / JSONL files."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import orjson

from ortserve.core.datatypes import BF16, BYTES, bf16_from_float32, datatype_of_numpy, numpy_dtype
from ortserve.loadtest.transports import HttpTarget, Payload
from ortserve.protocol.tensors import array_to_binary, array_to_json_data

__all__ = [
    "Encoding",
    "InputSpec",
    "Inputs",
    "encode_payload",
    "fetch_input_specs",
    "generated_inputs",
    "generated_payloads",
    "infer_path",
    "npz_inputs",
    "payloads_from_file",
]

Encoding = Literal["json", "binary"]
Array = npt.NDArray[np.generic]
Inputs = dict[str, tuple[str, Array]]
"""Named inputs of one request: (datatype, array)."""


@dataclass(frozen=True, slots=True)
class InputSpec:
    """A model input as its metadata states it (-1 for a dynamic dimension)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


def infer_path(model: str, version: str | None) -> str:
    """The OIP infer route for a model (and optional version)."""
    if version:
        return f"/v2/models/{model}/versions/{version}/infer"
    return f"/v2/models/{model}/infer"


def fetch_input_specs(
    target: HttpTarget, model: str, version: str | None, timeout_s: float = 10.0
) -> list[InputSpec]:
    """Read the model's inputs from ``GET /v2/models/<model>[/versions/<v>]``.

    Raises:
        ValueError: the server did not answer with the model's metadata.
    """
    path = infer_path(model, version).removesuffix("/infer")
    url = f"http://{target.host}:{target.port}{target.prefix}{path}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            document = json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        exc.close()  # it holds the response's socket
        raise ValueError(f"cannot read the metadata of model {model!r} at {url}: {exc}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ValueError(f"cannot read the metadata of model {model!r} at {url}: {exc}") from None
    return [InputSpec(i["name"], i["datatype"], tuple(i["shape"])) for i in document["inputs"]]


def _concrete_shape(
    spec: InputSpec, batch_size: int, overrides: dict[str, tuple[int, ...]]
) -> tuple[int, ...]:
    if spec.name in overrides:
        return overrides[spec.name]
    shape = [batch_size if index == 0 and dim < 0 else dim for index, dim in enumerate(spec.shape)]
    if any(dim < 0 for dim in shape):
        raise ValueError(f"input {spec.name!r} has dynamic dimensions {list(spec.shape)}: give --shape")
    return tuple(shape)


def _random_array(datatype: str, shape: tuple[int, ...], rng: np.random.Generator) -> Array:
    if datatype == BYTES:
        words = rng.integers(0, 10_000, size=shape)
        return np.array([f"w{w}".encode() for w in words.reshape(-1)], dtype=object).reshape(shape)
    if datatype == BF16:
        return bf16_from_float32(rng.standard_normal(shape))
    dtype = numpy_dtype(datatype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    return rng.integers(0, 100, size=shape).astype(dtype)


def generated_inputs(
    specs: list[InputSpec],
    batch_size: int = 1,
    count: int = 16,
    seed: int = 0,
    shapes: dict[str, tuple[int, ...]] | None = None,
) -> list[Inputs]:
    """``count`` distinct random input sets shaped by the metadata (dim 0 = ``batch_size``)."""
    rng = np.random.default_rng(seed)
    return [
        {
            spec.name: (
                spec.datatype,
                _random_array(spec.datatype, _concrete_shape(spec, batch_size, shapes or {}), rng),
            )
            for spec in specs
        }
        for _ in range(count)
    ]


def generated_payloads(
    specs: list[InputSpec],
    path: str,
    encoding: Encoding,
    batch_size: int = 1,
    count: int = 16,
    seed: int = 0,
    shapes: dict[str, tuple[int, ...]] | None = None,
) -> list[Payload]:
    """``count`` distinct random HTTP requests shaped by the metadata (dim 0 = ``batch_size``)."""
    inputs = generated_inputs(specs, batch_size, count, seed, shapes)
    return [encode_payload(arrays, path, encoding) for arrays in inputs]


def encode_payload(arrays: Inputs, path: str, encoding: Encoding) -> Payload:
    """An OIP infer request body for named (datatype, array) inputs."""
    inputs: list[dict[str, object]] = []
    binary: list[bytes] = []
    for name, (datatype, array) in arrays.items():
        entry: dict[str, object] = {"name": name, "shape": list(array.shape), "datatype": datatype}
        if encoding == "binary":
            raw = b"".join(bytes(chunk) for chunk in array_to_binary(array))
            entry["parameters"] = {"binary_data_size": len(raw)}
            binary.append(raw)
        elif datatype == BYTES:
            entry["data"] = [_text(item) for item in array.reshape(-1)]
        else:
            entry["data"] = array_to_json_data(array, datatype)
        inputs.append(entry)
    document: dict[str, object] = {"inputs": inputs}
    if encoding == "json":
        return Payload(path, orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY))
    document["parameters"] = {"binary_data_output": True}
    header = orjson.dumps(document)
    headers = (
        ("content-type", "application/octet-stream"),
        ("inference-header-content-length", str(len(header))),
    )
    return Payload(path, header + b"".join(binary), headers)


def payloads_from_file(file: Path, path: str, encoding: Encoding, batch_size: int = 1) -> list[Payload]:
    """Requests from ``.npz`` (one array per input, rows along dim 0) or JSONL (one OIP body a line).

    JSONL bodies are sent exactly as written, whatever ``encoding`` says.

    Raises:
        ValueError: the file holds no usable request.
    """
    if file.suffix == ".npz":
        return _npz_payloads(file, path, encoding, batch_size)
    payloads = [
        Payload(path, line.strip().encode())
        for line in file.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    if not payloads:
        raise ValueError(f"{file} holds no request")
    return payloads


def _npz_payloads(file: Path, path: str, encoding: Encoding, batch_size: int) -> list[Payload]:
    return [encode_payload(arrays, path, encoding) for arrays in npz_inputs(file, batch_size)]


def npz_inputs(file: Path, batch_size: int) -> list[Inputs]:
    """Input sets of ``batch_size`` rows from an ``.npz`` (one array per input, rows along dim 0).

    Raises:
        ValueError: no array, or fewer rows than the batch size.
    """
    with np.load(file, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    if not arrays:
        raise ValueError(f"{file} holds no array")
    rows = min(len(array) for array in arrays.values())
    if rows < batch_size:
        raise ValueError(f"{file} has {rows} rows, fewer than the batch size {batch_size}")
    return [
        {name: (_datatype(array), array[start : start + batch_size]) for name, array in arrays.items()}
        for start in range(0, rows - batch_size + 1, batch_size)
    ]


def _text(item: object) -> str:
    return item.decode("utf-8") if isinstance(item, bytes) else str(item)


def _datatype(array: Array) -> str:
    if array.dtype.kind in "SU":
        return BYTES
    return datatype_of_numpy(array.dtype)
