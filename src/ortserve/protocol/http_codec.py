"""Open Inference Protocol HTTP bodies: JSON and Triton's binary tensor data extension."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from ortserve.core.shared_memory import (
    SHARED_MEMORY_PARAMETERS,
    SharedMemoryRegistry,
    is_in_shared_memory,
)
from ortserve.core.types import (
    InferInput,
    InferRequest,
    InferResponse,
    ModelMetadata,
    Parameters,
    RequestedOutput,
    ServerMetadata,
)
from ortserve.errors import InvalidInput
from ortserve.protocol.schedule import schedule_fields
from ortserve.protocol.tensors import (
    TensorLimits,
    array_from_binary,
    array_from_json,
    array_to_binary,
    array_to_json_data,
    checked_shape,
)

__all__ = [
    "EncodedBody",
    "decode_infer_request",
    "encode_error",
    "encode_infer_request",
    "encode_infer_response",
    "encode_model_metadata",
    "encode_server_metadata",
    "parse_json_body",
]

_NUMPY = orjson.OPT_SERIALIZE_NUMPY
_MAX_ID_LENGTH = 1024


@dataclass(frozen=True, slots=True)
class EncodedBody:
    """A response body as buffers to write in order; ``header_length`` is set for binary."""

    chunks: list[bytes | memoryview]
    header_length: int | None


def parse_json_body(raw: bytes | memoryview) -> Any:
    """Parse JSON; NaN and Infinity (which orjson refuses) are accepted as data.

    Raises:
        InvalidInput: not JSON.
    """
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as fast_error:
        try:
            document = json.loads(bytes(raw))  # the stdlib reads NaN/Infinity tokens
        except (ValueError, RecursionError):
            raise InvalidInput(f"request body is not valid JSON: {fast_error}") from None
    # The stdlib also accepts escaped lone surrogates ("\ud800"), which are not text: no
    # encoder (the answer's, the log's, ONNX Runtime's) can write them. orjson refuses to
    # encode exactly those, so one C-speed pass finds any, anywhere in the document.
    try:
        orjson.dumps(document)
    except TypeError as exc:
        if "surrogates" in str(exc):
            raise InvalidInput(
                "request body holds a string with a lone surrogate (\\uD800-\\uDFFF)"
            ) from None
        raise InvalidInput(f"request body is not valid JSON: {exc}") from None
    return document


def _parameters(value: object, kind: str, name: str | None = None) -> Parameters:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"{_where(kind, name)}: 'parameters' must be an object")
    for key, item in value.items():
        if not isinstance(item, (bool, int, float, str)):
            raise InvalidInput(f"{_where(kind, name)}: parameter {key!r} must be a boolean, number or string")
    return value


def _where(kind: str, name: str | None) -> str:
    """Formatted only when an error is raised: the success path builds no message."""
    return kind if name is None else f"{kind} {name!r}"


def _decode_input(
    raw: object, binary: memoryview, offset: int, limits: TensorLimits, regions: SharedMemoryRegistry | None
) -> tuple[InferInput, int]:
    if not isinstance(raw, dict):
        raise InvalidInput("each entry of 'inputs' must be an object")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInput("an input has no 'name'")
    datatype = raw.get("datatype")
    if not isinstance(datatype, str):
        raise InvalidInput(f"input {name!r}: 'datatype' must be a string")
    shape = checked_shape(name, raw.get("shape"), limits)
    parameters = _parameters(raw.get("parameters"), "input", name)
    size = parameters.get("binary_data_size")
    shared = regions.view(parameters, f"input {name!r}") if parameters and regions is not None else None
    if shared is not None:
        if "data" in raw or size is not None:
            raise InvalidInput(f"input {name!r}: has a shared-memory region and data of its own")
        data = array_from_binary(name, datatype, shape, shared, limits)
    elif size is not None:
        if type(size) is not int or size < 0:
            raise InvalidInput(f"input {name!r}: 'binary_data_size' must be a non-negative integer")
        if "data" in raw:
            raise InvalidInput(f"input {name!r}: has both 'data' and 'binary_data_size'")
        if offset + size > len(binary):
            raise InvalidInput(f"input {name!r}: binary_data_size {size} runs past the end of the body")
        data = array_from_binary(name, datatype, shape, binary[offset : offset + size], limits)
        offset += size
    else:
        if "data" not in raw:
            raise InvalidInput(f"input {name!r}: has neither 'data' nor 'binary_data_size'")
        data = array_from_json(name, datatype, shape, raw["data"], limits)
    return InferInput(name, datatype, shape, data, parameters), offset


def _decode_outputs(raw: object, binary_default: bool) -> list[RequestedOutput] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise InvalidInput("'outputs' must be a list")
    outputs = []
    for entry in raw:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise InvalidInput("each entry of 'outputs' must be an object with a 'name'")
        parameters = dict(_parameters(entry.get("parameters"), "output", entry["name"]))
        binary = parameters.get("binary_data", binary_default)
        if not isinstance(binary, bool):
            raise InvalidInput(f"output {entry['name']!r}: 'binary_data' must be a boolean")
        parameters["binary_data"] = binary
        outputs.append(RequestedOutput(entry["name"], parameters))
    return outputs


def decode_infer_request(
    body: bytes,
    header_length: int | None,
    model_name: str,
    model_version: str | None,
    limits: TensorLimits,
    regions: SharedMemoryRegistry | None = None,
) -> InferRequest:
    """Decode an infer request body; tensors sent as binary become views of ``body``.

    Args:
        body: the whole HTTP body.
        header_length: ``Inference-Header-Content-Length``; None for a JSON-only body.
        regions: where inputs naming a shared-memory region are found (views, no copy).

    Raises:
        InvalidInput: anything malformed, inconsistent or over a limit, named.
    """
    if header_length is None:
        header_length = len(body)
    elif not 0 <= header_length <= len(body):
        raise InvalidInput("Inference-Header-Content-Length is larger than the body")
    view = memoryview(body)
    document = parse_json_body(view[:header_length])
    if not isinstance(document, dict):
        raise InvalidInput("the request body must be a JSON object")
    request_id = document.get("id")
    if request_id is not None and (not isinstance(request_id, str) or len(request_id) > _MAX_ID_LENGTH):
        raise InvalidInput("'id' must be a string of at most 1024 characters")
    parameters = _parameters(document.get("parameters"), "request")
    priority, timeout_s = schedule_fields(parameters)
    raw_inputs = document.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInput("'inputs' must be a non-empty list")
    binary = view[header_length:]
    offset = 0
    inputs = []
    for raw in raw_inputs:
        tensor, offset = _decode_input(raw, binary, offset, limits, regions)
        inputs.append(tensor)
    if offset != len(binary):
        raise InvalidInput(f"{len(binary) - offset} bytes of binary data are not claimed by any input")
    binary_default = parameters.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise InvalidInput("parameter 'binary_data_output' must be a boolean")
    outputs = _decode_outputs(document.get("outputs"), binary_default)
    return InferRequest(
        model_name, inputs, model_version, request_id, outputs, parameters, priority, timeout_s
    )


def encode_infer_request(request: InferRequest) -> EncodedBody:
    """The request as an HTTP body with every input in binary (the inverse of decoding).

    Used to record requests that arrived over gRPC in the same form as HTTP ones, so a
    capture replays over HTTP with the same tensors, id, parameters and requested outputs.
    """
    inputs: list[dict[str, Any]] = []
    chunks: list[bytes | memoryview] = []
    for tensor in request.inputs:
        binary = array_to_binary(tensor.data)
        size = sum(len(c) for c in binary)
        # The data travels inline now, so a shared-memory reference would contradict it.
        parameters = {k: v for k, v in tensor.parameters.items() if k not in SHARED_MEMORY_PARAMETERS}
        parameters["binary_data_size"] = size
        inputs.append(
            {
                "name": tensor.name,
                "datatype": tensor.datatype,
                "shape": list(tensor.shape),
                "parameters": parameters,
            }
        )
        chunks.extend(binary)
    document: dict[str, Any] = {"inputs": inputs}
    if request.id is not None:
        document["id"] = request.id
    if request.parameters:
        document["parameters"] = request.parameters
    if request.outputs is not None:
        document["outputs"] = [{"name": o.name, "parameters": o.parameters} for o in request.outputs]
    header = orjson.dumps(document)
    return EncodedBody([header, *chunks], len(header))


def _wants_binary(parameters: Parameters, default: bool) -> bool:
    return bool(parameters.get("binary_data", default))


def encode_infer_response(response: InferResponse, binary_default: bool) -> EncodedBody:
    """The response as JSON, with binary outputs appended after the JSON header."""
    outputs: list[dict[str, Any]] = []
    binary_chunks: list[bytes | memoryview] = []
    for output in response.outputs:
        entry: dict[str, Any] = {
            "name": output.name,
            "datatype": output.datatype,
            "shape": list(output.shape),
        }
        if is_in_shared_memory(output.parameters):
            entry["parameters"] = output.parameters
        elif _wants_binary(output.parameters, binary_default):
            chunks = array_to_binary(output.data)
            entry["parameters"] = {"binary_data_size": sum(len(c) for c in chunks)}
            binary_chunks.extend(chunks)
        else:
            entry["data"] = array_to_json_data(output.data, output.datatype)
        outputs.append(entry)
    document: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
        "outputs": outputs,
    }
    if response.id is not None:
        document["id"] = response.id
    if response.parameters:
        document["parameters"] = response.parameters
    header = orjson.dumps(document, option=_NUMPY)
    if b"null" in header:
        # orjson writes NaN and Infinity as null; nothing else in this document is ever null,
        # so one byte scan finds non-finite floats (text that merely contains "null" only
        # takes the slower, equally correct path).
        header = _dumps_non_finite(document)
    if not binary_chunks:
        return EncodedBody([header], None)
    return EncodedBody([header, *binary_chunks], len(header))


_NON_FINITE_NAMES = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _finite_or_name(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return _NON_FINITE_NAMES[repr(value)]
    return value


def _dumps_non_finite(document: dict[str, Any]) -> bytes:
    """Strict JSON with non-finite floats as the strings "NaN", "Infinity", "-Infinity".

    Bare NaN/Infinity tokens are not JSON: ``JSON.parse``, Go and Rust parsers reject the
    whole answer. Strings are accepted by every parser, and NumPy (tritonclient's
    ``as_numpy``) turns them back into the floats; the server reads them in requests too.
    """

    def default(value: object) -> object:
        if isinstance(value, np.ndarray):
            return [_finite_or_name(item) for item in value.tolist()]
        raise TypeError(type(value).__name__)

    return json.dumps(document, default=default, separators=(",", ":"), allow_nan=False).encode()


def encode_error(message: str) -> bytes:
    return orjson.dumps({"error": message})


def _tensor_meta(spec: Any) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}


def encode_model_metadata(metadata: ModelMetadata) -> bytes:
    document: dict[str, object] = {
        "name": metadata.name,
        "versions": list(metadata.versions),
        "platform": metadata.platform,
        "inputs": [_tensor_meta(s) for s in metadata.inputs],
        "outputs": [_tensor_meta(s) for s in metadata.outputs],
    }
    parameters: dict[str, object] = dict(metadata.parameters)
    if metadata.roles:
        parameters["roles"] = dict(metadata.roles)
    if parameters:
        document["parameters"] = parameters
    return orjson.dumps(document)


def encode_server_metadata(metadata: ServerMetadata) -> bytes:
    return orjson.dumps(
        {"name": metadata.name, "version": metadata.version, "extensions": list(metadata.extensions)}
    )
