"""The gRPC codec: raw and typed tensors in, raw tensors out, Triton's field numbers, refusals named."""

from __future__ import annotations

import struct
from multiprocessing import shared_memory
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as triton_pb

from ortserve.core.shared_memory import SharedMemoryRegistry
from ortserve.core.types import InferOutput, InferResponse
from ortserve.errors import DeadlineExceeded, InvalidInput
from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.protocol.grpc.codec import (
    decode_infer_request,
    encode_infer_response,
    encode_model_statistics,
    request_timeout,
)
from ortserve.protocol.tensors import TensorLimits
from ortserve.statistics import BatchSizeSnapshot, Duration, StatisticsSnapshot
from shared_memory_helpers import buffer_of, key_of

LIMITS = TensorLimits(max_elements=1_000_000, max_depth=8, max_bytes_element=1024)
Tensor = pb.ModelInferRequest.InferInputTensor


def raw_request(array: np.ndarray, datatype: str = "FP32", name: str = "x") -> pb.ModelInferRequest:
    return pb.ModelInferRequest(
        model_name="m",
        inputs=[Tensor(name=name, datatype=datatype, shape=array.shape)],
        raw_input_contents=[array.tobytes()],
    )


def typed_request(datatype: str, shape: list[int], **contents: Any) -> pb.ModelInferRequest:
    tensor = Tensor(name="x", datatype=datatype, shape=shape, contents=pb.InferTensorContents(**contents))
    return pb.ModelInferRequest(model_name="m", inputs=[tensor])


def test_raw_input_contents_become_read_only_views_not_copies() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    data = decode_infer_request(raw_request(array), LIMITS).inputs[0].data
    np.testing.assert_array_equal(data, array)
    assert data.dtype == np.float32 and not data.flags.owndata and not data.flags.writeable


def test_fp16_travels_in_raw_contents() -> None:
    array = np.array([0.5, -1.0, 65504.0], dtype=np.float16)
    data = decode_infer_request(raw_request(array, "FP16"), LIMITS).inputs[0].data
    assert data.dtype == np.float16
    np.testing.assert_array_equal(data, array)


def test_bf16_raw_contents_are_two_little_endian_bytes_an_element() -> None:
    request = pb.ModelInferRequest(
        model_name="m",
        inputs=[Tensor(name="x", datatype="BF16", shape=[1, 3])],
        raw_input_contents=[b"\x80\x3f\xc0\xbf\xc0\x7f"],
    )
    data = decode_infer_request(request, LIMITS).inputs[0].data
    assert data.dtype == np.uint16 and data.shape == (1, 3)
    assert data.reshape(-1).tolist() == [0x3F80, 0xBFC0, 0x7FC0]


def test_bf16_outputs_travel_as_their_raw_bits() -> None:
    bits = np.array([0x3F80, 0xC040], dtype=np.uint16)
    message = encode_infer_response(InferResponse("m", "1", [InferOutput("y", "BF16", (2,), bits)]))
    assert message.outputs[0].datatype == "BF16"
    assert message.raw_output_contents[0] == b"\x80\x3f\x40\xc0"


def test_raw_bytes_elements_carry_four_byte_length_prefixes() -> None:
    raw = b"".join(struct.pack("<I", len(item)) + item for item in (b"hello", b"", b"w\xc3\xb6rld"))
    request = pb.ModelInferRequest(
        model_name="m", inputs=[Tensor(name="x", datatype="BYTES", shape=[3])], raw_input_contents=[raw]
    )
    data = decode_infer_request(request, LIMITS).inputs[0].data
    assert list(data) == [b"hello", b"", b"w\xc3\xb6rld"]


def test_a_bytes_shape_its_data_cannot_hold_is_refused_before_anything_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Four bytes declared as 2^17 BYTES elements: refused by arithmetic (each element has a
    4-byte length), not after an object array of the declared size was made (2^26 elements,
    the server's default limit, made 512 MiB for a 40-byte request)."""
    made: list[object] = []
    real_empty = np.empty

    def counting_empty(*args: Any, **kwargs: Any) -> Any:
        made.append(args)
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(np, "empty", counting_empty)
    request = pb.ModelInferRequest(
        model_name="m",
        inputs=[Tensor(name="x", datatype="BYTES", shape=[1 << 17])],
        raw_input_contents=[bytes(4)],
    )
    with pytest.raises(
        InvalidInput, match="4 bytes of BYTES data hold at most 1 elements, the shape declares 131072"
    ):
        decode_infer_request(request, LIMITS)
    assert made == []


def test_tensors_made_of_python_objects_are_bounded_in_elements() -> None:
    """BYTES and typed contents become a Python object per element on the loop: 15 million
    empty BYTES elements (60 KB deflated) held it 8 s. Beyond the bound: raw binary."""
    small = TensorLimits(max_object_elements=8)
    raw = struct.pack("<I", 0) * 9
    request = pb.ModelInferRequest(
        model_name="m", inputs=[Tensor(name="x", datatype="BYTES", shape=[9])], raw_input_contents=[raw]
    )
    with pytest.raises(InvalidInput, match="9 BYTES elements, at most 8 in one tensor"):
        decode_infer_request(request, small)
    with pytest.raises(InvalidInput, match="at most 8 elements .* raw_input_contents"):
        decode_infer_request(typed_request("INT64", [9], int64_contents=list(range(9))), small)
    assert decode_infer_request(typed_request("INT64", [8], int64_contents=list(range(8))), small)


def test_a_shape_of_more_than_64_dims_is_refused_by_its_length() -> None:
    request = typed_request("INT64", [1] * 100, int64_contents=[1])
    with pytest.raises(InvalidInput, match="rank 100 exceeds 64"):
        decode_infer_request(request, LIMITS)


@pytest.mark.parametrize(
    ("datatype", "field", "values", "dtype"),
    [
        ("BOOL", "bool_contents", [True, False], np.bool_),
        ("INT8", "int_contents", [-128, 127], np.int8),
        ("INT32", "int_contents", [-(2**31), 7], np.int32),
        ("INT64", "int64_contents", [2**40, -3], np.int64),
        ("UINT8", "uint_contents", [0, 255], np.uint8),
        ("UINT64", "uint64_contents", [2**63, 1], np.uint64),
        ("FP32", "fp32_contents", [0.5, -2.0], np.float32),
        ("FP64", "fp64_contents", [1e300, -0.25], np.float64),
    ],
)
def test_typed_contents_are_accepted_for_their_datatype(
    datatype: str, field: str, values: list[object], dtype: type
) -> None:
    data = decode_infer_request(typed_request(datatype, [2], **{field: values}), LIMITS).inputs[0].data
    assert data.dtype == dtype
    np.testing.assert_array_equal(data, np.array(values, dtype=dtype))


def test_typed_bytes_contents_keep_each_element() -> None:
    request = typed_request("BYTES", [1, 2], bytes_contents=[b"a", b"bc"])
    data = decode_infer_request(request, LIMITS).inputs[0].data
    assert data.shape == (1, 2) and list(data.reshape(-1)) == [b"a", b"bc"]


@pytest.mark.parametrize(
    ("request_message", "message"),
    [
        (typed_request("FP32", [2], int_contents=[1, 2]), "belongs in fp32_contents"),
        (typed_request("FP32", [3], fp32_contents=[1.0, 2.0]), "needs 3"),
        (typed_request("INT8", [1], int_contents=[300]), "out of range for INT8"),
        (typed_request("FP16", [1], fp32_contents=[1.0]), "raw_input_contents"),
        (
            typed_request("BF16", [1], fp32_contents=[1.0]),
            "no field for BF16; send its data in raw_input_contents",
        ),
        (typed_request("NOPE", [1], fp32_contents=[1.0]), "unsupported datatype"),
        (typed_request("FP32", [1_000_000_000, 64], fp32_contents=[1.0]), "exceeds the limit"),
        (typed_request("FP32", [2**32, 2**32, 0], fp32_contents=[]), "exceeds the limit"),
        (raw_request(np.zeros(3, np.float32), "FP64"), "needs 24"),
    ],
)
def test_malformed_tensors_are_refused_by_name(request_message: pb.ModelInferRequest, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        decode_infer_request(request_message, LIMITS)


def test_raw_contents_must_cover_every_input() -> None:
    request = raw_request(np.zeros(2, np.float32))
    request.inputs.add(name="y", datatype="FP32", shape=[2])
    with pytest.raises(InvalidInput, match="input 'y' has no entry in raw_input_contents"):
        decode_infer_request(request, LIMITS)


def test_raw_contents_may_not_outnumber_the_inputs_on_the_wire() -> None:
    request = raw_request(np.zeros(2, np.float32))
    request.raw_input_contents.append(b"\0" * 8)
    with pytest.raises(InvalidInput, match="2 entries for 1 inputs sent on the wire"):
        decode_infer_request(request, LIMITS)


def test_an_input_may_not_have_both_contents_and_raw_contents() -> None:
    request = raw_request(np.zeros(2, np.float32))
    request.inputs[0].contents.fp32_contents.extend([1.0, 2.0])
    with pytest.raises(InvalidInput, match="both contents and raw_input_contents"):
        decode_infer_request(request, LIMITS)


def test_an_input_without_data_is_refused() -> None:
    request = pb.ModelInferRequest(model_name="m", inputs=[Tensor(name="x", datatype="FP32", shape=[2])])
    with pytest.raises(InvalidInput, match="has 0 elements"):
        decode_infer_request(request, LIMITS)


def test_schedule_parameters_set_priority_and_timeout() -> None:
    request = raw_request(np.zeros(1, np.float32))
    request.id = "req-7"
    request.model_version = "3"
    request.parameters["priority"].uint64_param = 2
    request.parameters["timeout"].int64_param = 250_000
    request.parameters["tag"].string_param = "a"
    decoded = decode_infer_request(request, LIMITS)
    assert (decoded.priority, decoded.timeout_s) == (2, 0.25)
    assert (decoded.id, decoded.model_version) == ("req-7", "3")
    assert decoded.parameters["tag"] == "a"


def test_a_negative_timeout_is_refused() -> None:
    request = raw_request(np.zeros(1, np.float32))
    request.parameters["timeout"].int64_param = -5
    with pytest.raises(InvalidInput, match="timeout"):
        decode_infer_request(request, LIMITS)


def test_requested_outputs_keep_their_parameters_classification_among_them() -> None:
    request = raw_request(np.zeros(1, np.float32))
    request.outputs.add(name="y").parameters["hint"].bool_param = True
    outputs = decode_infer_request(request, LIMITS).outputs
    assert outputs is not None and outputs[0].parameters == {"hint": True}
    request.outputs[0].parameters["classification"].int64_param = 2
    outputs = decode_infer_request(request, LIMITS).outputs
    assert outputs is not None and outputs[0].parameters == {"hint": True, "classification": 2}


def test_a_request_naming_a_sequence_is_refused() -> None:
    request = raw_request(np.zeros(1, np.float32))
    request.parameters["sequence_id"].uint64_param = 0  # tritonclient's "no sequence"
    decode_infer_request(request, LIMITS)
    request.parameters["sequence_id"].uint64_param = 42
    with pytest.raises(InvalidInput, match="stateless"):
        decode_infer_request(request, LIMITS)


def test_the_calls_deadline_tightens_the_timeout_parameter() -> None:
    assert request_timeout(None, None) is None
    assert request_timeout(0.5, None) == 0.5
    assert request_timeout(None, 0.2) == 0.2
    assert request_timeout(0.5, 0.2) == 0.2
    assert request_timeout(0.1, 0.2) == 0.1
    with pytest.raises(DeadlineExceeded):
        request_timeout(0.5, 0.0)


def test_responses_carry_every_output_in_raw_contents() -> None:
    numbers = np.arange(4, dtype=np.float32).reshape(2, 2)
    words = np.array([b"ab", "c\u00e9"], dtype=object)
    response = InferResponse(
        "m",
        "1",
        [InferOutput("y", "FP32", (2, 2), numbers), InferOutput("w", "BYTES", (2,), words)],
        id="r1",
        parameters={"note": "x", "n": 3, "ok": True},
    )
    message = encode_infer_response(response)
    assert (message.model_name, message.model_version, message.id) == ("m", "1", "r1")
    assert [(o.name, o.datatype, list(o.shape)) for o in message.outputs] == [
        ("y", "FP32", [2, 2]),
        ("w", "BYTES", [2]),
    ]
    np.testing.assert_array_equal(
        np.frombuffer(message.raw_output_contents[0], np.float32).reshape(2, 2), numbers
    )
    assert message.raw_output_contents[1] == b"\x02\x00\x00\x00ab\x03\x00\x00\x00c\xc3\xa9"
    assert message.parameters["n"].int64_param == 3 and message.parameters["ok"].bool_param


def test_statistics_keep_tritons_shape() -> None:
    snapshot = StatisticsSnapshot(
        "m", "2", 1234, 10, 4, Duration(5, 900), Duration(1, 50), Duration(5, 300),
        Duration(5, 10), Duration(5, 700), Duration(5, 20),
        (BatchSizeSnapshot(2, Duration(3, 6), Duration(3, 600), Duration(3, 9)),),
    )  # fmt: skip
    message = encode_model_statistics([snapshot])
    theirs = triton_pb.ModelStatisticsResponse.FromString(message.SerializeToString())
    stats = theirs.model_stats[0]
    assert (stats.name, stats.version, stats.last_inference, stats.inference_count) == ("m", "2", 1234, 10)
    assert (stats.inference_stats.success.count, stats.inference_stats.success.ns) == (5, 900)
    assert stats.inference_stats.compute_infer.ns == 700
    assert (stats.batch_stats[0].batch_size, stats.batch_stats[0].compute_infer.count) == (2, 3)


def _fields(descriptor: object) -> dict[int, tuple[str, int, bool]]:
    return {f.number: (f.name, f.type, f.is_repeated) for f in descriptor.fields}  # type: ignore[attr-defined]


def _all_messages(descriptor: object, prefix: str = "") -> dict[str, object]:
    found = {}
    for message in descriptor.message_types_by_name.values() if not prefix else descriptor.nested_types:  # type: ignore[attr-defined]
        name = f"{prefix}{message.name}"
        found[name] = message
        found.update(_all_messages(message, f"{name}."))
    return found


def test_every_message_matches_tritons_published_field_numbers() -> None:
    ours = _all_messages(pb.DESCRIPTOR)
    theirs = _all_messages(triton_pb.DESCRIPTOR)
    for name, message in ours.items():
        reserved_only = not message.fields and theirs[name].fields  # type: ignore[attr-defined]
        if reserved_only:  # ModelConfigResponse / ModelStatisticsResponse: model_config.proto types
            continue
        assert _fields(message) == _fields(theirs[name]), name


def test_the_service_has_tritons_full_name_and_method_signatures() -> None:
    ours = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    theirs = triton_pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert ours.full_name == theirs.full_name == "inference.GRPCInferenceService"
    for method in ours.methods:
        other = theirs.methods_by_name[method.name]
        assert method.input_type.full_name == other.input_type.full_name
        assert method.output_type.full_name == other.output_type.full_name
        assert (method.client_streaming, method.server_streaming) == (
            other.client_streaming,
            other.server_streaming,
        )


def test_a_request_serialized_by_tritonclient_decodes_identically() -> None:
    theirs = triton_pb.ModelInferRequest(model_name="m", id="z")
    theirs.inputs.add(name="x", datatype="INT64", shape=[2])
    theirs.raw_input_contents.append(np.array([5, -6], np.int64).tobytes())
    theirs.parameters["priority"].uint64_param = 1
    decoded = decode_infer_request(pb.ModelInferRequest.FromString(theirs.SerializeToString()), LIMITS)
    np.testing.assert_array_equal(decoded.inputs[0].data, [5, -6])
    assert (decoded.id, decoded.priority) == ("z", 1)


def shm_tensor(name: str) -> pb.ModelInferRequest.InferInputTensor:
    tensor = Tensor(name=name, datatype="FP32", shape=[2])
    tensor.parameters["shared_memory_region"].string_param = "r"
    tensor.parameters["shared_memory_byte_size"].int64_param = 8
    return tensor


def test_an_input_in_shared_memory_takes_no_raw_contents_entry(block: shared_memory.SharedMemory) -> None:
    regions = SharedMemoryRegistry(1)
    regions.register("r", key_of(block), 0, 64)
    buffer_of(block)[:8] = np.array([5, 6], np.float32).tobytes()
    request = raw_request(np.array([1, 2], np.float32), name="wire")
    request.inputs.insert(0, shm_tensor("shared"))
    decoded = decode_infer_request(request, LIMITS, regions)
    assert [i.data.tolist() for i in decoded.inputs] == [[5, 6], [1, 2]]


def test_an_input_with_a_region_and_contents_is_refused(block: shared_memory.SharedMemory) -> None:
    regions = SharedMemoryRegistry(1)
    regions.register("r", key_of(block), 0, 64)
    tensor = shm_tensor("x")
    tensor.contents.fp32_contents.extend([1.0, 2.0])
    request = pb.ModelInferRequest(model_name="m", inputs=[tensor])
    with pytest.raises(InvalidInput, match="has both contents and a shared-memory region"):
        decode_infer_request(request, LIMITS, regions)


def test_an_output_in_shared_memory_keeps_its_place_with_empty_raw_contents() -> None:
    in_shm = InferOutput("a", "FP32", (1,), np.ones(1, np.float32), {"shared_memory_region": "r"})
    on_wire = InferOutput("b", "FP32", (1,), np.ones(1, np.float32))
    answer = encode_infer_response(InferResponse("m", "1", [in_shm, on_wire]))
    assert list(answer.raw_output_contents) == [b"", np.ones(1, np.float32).tobytes()]
    assert answer.outputs[0].parameters["shared_memory_region"].string_param == "r"
