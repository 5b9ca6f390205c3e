"""Open Inference Protocol gRPC messages <-> core types (pure functions, no gRPC runtime)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from ortserve.core.datatypes import BYTES, numpy_dtype
from ortserve.core.shared_memory import RegionStatus, SharedMemoryRegistry, is_in_shared_memory
from ortserve.core.types import (
    InferInput,
    InferRequest,
    InferResponse,
    ModelMetadata,
    Parameters,
    ParameterValue,
    RequestedOutput,
    ServerMetadata,
    TensorSpec,
)
from ortserve.errors import DeadlineExceeded, InvalidInput
from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.protocol.schedule import schedule_fields
from ortserve.protocol.tensors import (
    MAX_RANK,
    TensorLimits,
    array_from_binary,
    array_to_binary,
    checked_shape,
    element_count,
)
from ortserve.statistics import Duration, StatisticsSnapshot

__all__ = [
    "decode_infer_request",
    "encode_infer_response",
    "encode_model_metadata",
    "encode_model_statistics",
    "encode_parameters",
    "encode_server_metadata",
    "encode_shared_memory_status",
    "request_timeout",
]

Array = npt.NDArray[np.generic]
_MAX_ID_LENGTH = 1024

# Which InferTensorContents field carries each datatype (FP16/BF16 have none: raw only).
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
_ALL_CONTENTS_FIELDS = frozenset(_CONTENTS_FIELD.values())


def decode_parameters(parameters: Mapping[str, pb.InferParameter], where: str) -> Parameters:
    """A protobuf parameter map as plain values (an unset oneof is refused)."""
    decoded: Parameters = {}
    if not parameters:  # the common case; iterating an empty map still costs a few us
        return decoded
    for key, parameter in parameters.items():
        choice = parameter.WhichOneof("parameter_choice")
        if choice is None:
            raise InvalidInput(f"{where}: parameter {key!r} has no value")
        value: ParameterValue = getattr(parameter, choice)
        decoded[key] = value
    return decoded


def encode_parameters(parameters: Parameters) -> dict[str, pb.InferParameter]:
    """Plain values as protobuf parameters (bool before int: ``bool`` is an ``int``)."""
    encoded = {}
    for key, value in parameters.items():
        if isinstance(value, bool):
            encoded[key] = pb.InferParameter(bool_param=value)
        elif isinstance(value, int):
            encoded[key] = pb.InferParameter(int64_param=value)
        elif isinstance(value, float):
            encoded[key] = pb.InferParameter(double_param=value)
        else:
            encoded[key] = pb.InferParameter(string_param=value)
    return encoded


def request_timeout(parameter_timeout_s: float | None, call_remaining_s: float | None) -> float | None:
    """The stricter of the request's ``timeout`` parameter and the gRPC call's deadline.

    Raises:
        DeadlineExceeded: the call's deadline has already passed.
    """
    if call_remaining_s is None:
        return parameter_timeout_s
    if call_remaining_s <= 0:
        raise DeadlineExceeded("the call's deadline passed before the request was admitted")
    if parameter_timeout_s is None:
        return call_remaining_s
    return min(parameter_timeout_s, call_remaining_s)


def _typed_contents(
    tensor: pb.ModelInferRequest.InferInputTensor, shape: tuple[int, ...], limits: TensorLimits
) -> Array:
    name, datatype = tensor.name, tensor.datatype
    if element_count(shape) > limits.max_object_elements:
        raise InvalidInput(
            f"input {name!r}: InferTensorContents carries at most {limits.max_object_elements} "
            "elements (each becomes a Python object); send larger tensors in raw_input_contents"
        )
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        numpy_dtype(datatype)  # an unknown datatype is named as such
        raise InvalidInput(
            f"input {name!r}: InferTensorContents has no field for {datatype}; "
            "send its data in raw_input_contents"
        )
    contents = tensor.contents
    for other in _ALL_CONTENTS_FIELDS - {field}:
        if len(getattr(contents, other)):
            raise InvalidInput(f"input {name!r}: {datatype} data belongs in {field}, not {other}")
    values: Sequence[object] = getattr(contents, field)
    expected = element_count(shape)
    if len(values) != expected:
        raise InvalidInput(
            f"input {name!r}: {field} has {len(values)} elements, shape {list(shape)} needs {expected}"
        )
    if datatype == BYTES:
        array = np.empty(expected, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    dtype = numpy_dtype(datatype)
    wide = np.array(values, dtype=np.float64 if dtype.kind == "f" else None)
    if dtype.kind in "iu" and wide.size:
        info = np.iinfo(dtype)  # type: ignore[type-var]
        if int(wide.min()) < info.min or int(wide.max()) > info.max:
            raise InvalidInput(f"input {name!r}: a value is out of range for {datatype}")
    return wide.astype(dtype, copy=False).reshape(shape)


def _decode_input(
    tensor: pb.ModelInferRequest.InferInputTensor,
    raws: Sequence[bytes],
    index: int,
    limits: TensorLimits,
    regions: SharedMemoryRegistry | None,
) -> tuple[InferInput, int]:
    """One input, and the index of the next unused raw content (shared-memory inputs use none)."""
    name = tensor.name
    if not name:
        raise InvalidInput("an input has no 'name'")
    dims = tensor.shape
    if len(dims) > MAX_RANK:  # before list(): a packed shape of 63 MiB is 63 million dims
        raise InvalidInput(f"input {name!r}: rank {len(dims)} exceeds {MAX_RANK}")
    shape = checked_shape(name, list(dims), limits)
    parameters = decode_parameters(tensor.parameters, f"input {name!r}")
    shared = regions.view(parameters, f"input {name!r}") if parameters and regions is not None else None
    if shared is not None:
        if tensor.HasField("contents"):
            raise InvalidInput(f"input {name!r}: has both contents and a shared-memory region")
        data = array_from_binary(name, tensor.datatype, shape, shared, limits)
    elif not raws:
        data = _typed_contents(tensor, shape, limits)
    elif tensor.HasField("contents"):
        raise InvalidInput(f"input {name!r}: has both contents and raw_input_contents")
    elif index >= len(raws):
        raise InvalidInput(f"input {name!r} has no entry in raw_input_contents")
    else:
        data = array_from_binary(name, tensor.datatype, shape, memoryview(raws[index]), limits)
        index += 1
    return InferInput(name, tensor.datatype, shape, data, parameters), index


def _decode_outputs(
    outputs: Sequence[pb.ModelInferRequest.InferRequestedOutputTensor],
) -> list[RequestedOutput] | None:
    if not outputs:
        return None
    decoded = []
    for output in outputs:
        parameters = decode_parameters(output.parameters, f"output {output.name!r}")
        decoded.append(RequestedOutput(output.name, parameters))
    return decoded


def decode_infer_request(
    message: pb.ModelInferRequest, limits: TensorLimits, regions: SharedMemoryRegistry | None = None
) -> InferRequest:
    """A ModelInferRequest as an InferRequest; raw contents become ``np.frombuffer`` views.

    Inputs that name a shared-memory region in ``regions`` become views of its mapping and
    take no entry of ``raw_input_contents`` (as tritonclient sends them).

    ``timeout_s`` comes from the ``timeout`` parameter only; the transport tightens it with
    the call's deadline (:func:`request_timeout`).

    Raises:
        InvalidInput: anything malformed, inconsistent or over a limit, named.
    """
    if len(message.id) > _MAX_ID_LENGTH:
        raise InvalidInput("'id' must be at most 1024 characters")
    tensors = message.inputs
    if not tensors:
        raise InvalidInput("'inputs' must not be empty")
    raws = message.raw_input_contents
    parameters = decode_parameters(message.parameters, "request")
    priority, timeout_s = schedule_fields(parameters)
    inputs = []
    used = 0
    for tensor in tensors:
        tensor_input, used = _decode_input(tensor, raws, used, limits, regions)
        inputs.append(tensor_input)
    if used != len(raws):
        raise InvalidInput(
            f"raw_input_contents has {len(raws)} entries for {used} inputs sent on the wire; "
            "when used it must carry every input not in shared memory"
        )
    return InferRequest(
        message.model_name,
        inputs,
        message.model_version or None,
        message.id or None,
        _decode_outputs(message.outputs),
        parameters,
        priority,
        timeout_s,
    )


def _raw_bytes(array: Array) -> bytes:
    chunks = array_to_binary(array)
    return bytes(chunks[0]) if len(chunks) == 1 else b"".join(chunks)


def encode_infer_response(response: InferResponse) -> pb.ModelInferResponse:
    """An InferResponse with every output in ``raw_output_contents`` (as Triton answers).

    An output written to shared memory keeps its place there with an empty entry, so the
    entries still line up with ``outputs`` (tritonclient finds them by position).
    """
    outputs = [
        pb.ModelInferResponse.InferOutputTensor(
            name=output.name,
            datatype=output.datatype,
            shape=output.shape,
            parameters=encode_parameters(output.parameters) if output.parameters else None,
        )
        for output in response.outputs
    ]
    return pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id or "",
        parameters=encode_parameters(response.parameters) if response.parameters else None,
        outputs=outputs,
        raw_output_contents=[
            b"" if is_in_shared_memory(output.parameters) else _raw_bytes(output.data)
            for output in response.outputs
        ],
    )


def _tensor_metadata(spec: TensorSpec) -> pb.ModelMetadataResponse.TensorMetadata:
    return pb.ModelMetadataResponse.TensorMetadata(name=spec.name, datatype=spec.datatype, shape=spec.shape)


def encode_model_metadata(metadata: ModelMetadata) -> pb.ModelMetadataResponse:
    return pb.ModelMetadataResponse(
        name=metadata.name,
        versions=metadata.versions,
        platform=metadata.platform,
        inputs=[_tensor_metadata(spec) for spec in metadata.inputs],
        outputs=[_tensor_metadata(spec) for spec in metadata.outputs],
    )


def encode_server_metadata(metadata: ServerMetadata) -> pb.ServerMetadataResponse:
    return pb.ServerMetadataResponse(
        name=metadata.name, version=metadata.version, extensions=metadata.extensions
    )


def _duration(duration: Duration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=duration.count, ns=duration.ns)


def _model_statistics(snapshot: StatisticsSnapshot) -> pb.ModelStatistics:
    return pb.ModelStatistics(
        name=snapshot.name,
        version=snapshot.version,
        last_inference=snapshot.last_inference_ms,
        inference_count=snapshot.inference_count,
        execution_count=snapshot.execution_count,
        inference_stats=pb.InferStatistics(
            success=_duration(snapshot.success),
            fail=_duration(snapshot.fail),
            queue=_duration(snapshot.queue),
            compute_input=_duration(snapshot.compute_input),
            compute_infer=_duration(snapshot.compute_infer),
            compute_output=_duration(snapshot.compute_output),
            cache_hit=pb.StatisticDuration(),
            cache_miss=pb.StatisticDuration(),
        ),
        batch_stats=[
            pb.InferBatchStatistics(
                batch_size=batch.batch_size,
                compute_input=_duration(batch.compute_input),
                compute_infer=_duration(batch.compute_infer),
                compute_output=_duration(batch.compute_output),
            )
            for batch in snapshot.batch_stats
        ],
    )


def encode_model_statistics(snapshots: list[StatisticsSnapshot]) -> pb.ModelStatisticsResponse:
    """Triton's statistics extension answer, one entry per version."""
    return pb.ModelStatisticsResponse(model_stats=[_model_statistics(s) for s in snapshots])


def encode_shared_memory_status(regions: list[RegionStatus]) -> pb.SystemSharedMemoryStatusResponse:
    """The system shared-memory status answer, regions keyed by name."""
    Status = pb.SystemSharedMemoryStatusResponse.RegionStatus
    return pb.SystemSharedMemoryStatusResponse(
        regions={
            r.name: Status(name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size) for r in regions
        }
    )
