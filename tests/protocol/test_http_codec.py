"""The HTTP codec: JSON and binary tensors in, JSON and binary tensors out, every refusal named."""

from __future__ import annotations

import json
import struct
from multiprocessing import shared_memory

import numpy as np
import orjson
import pytest

from ortserve.core.shared_memory import SharedMemoryRegistry
from ortserve.core.types import InferOutput, InferRequest, InferResponse
from ortserve.errors import InvalidInput
from ortserve.protocol.http_codec import decode_infer_request, encode_infer_request, encode_infer_response
from ortserve.protocol.tensors import TensorLimits
from shared_memory_helpers import buffer_of, key_of

LIMITS = TensorLimits(max_elements=1_000_000, max_depth=8, max_bytes_element=1024)


def decode(document: object, binary: bytes = b"") -> InferRequest:
    header = json.dumps(document).encode()
    return decode_infer_request(header + binary, len(header) if binary else None, "m", None, LIMITS)


def one_input(**fields: object) -> dict[str, object]:
    tensor: dict[str, object] = {"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3, 4]}
    tensor.update(fields)
    return {"inputs": [tensor]}


def test_flat_json_data_becomes_an_array_of_the_declared_shape() -> None:
    request = decode(one_input())
    array = request.inputs[0].data
    assert array.dtype == np.float32 and array.shape == (2, 2)
    np.testing.assert_array_equal(array, [[1, 2], [3, 4]])


def test_nested_json_data_following_the_shape_is_accepted() -> None:
    request = decode(one_input(data=[[1, 2], [3, 4]]))
    np.testing.assert_array_equal(request.inputs[0].data, [[1, 2], [3, 4]])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"data": [1, 2, 3]}, "has 3 elements"),
        ({"data": [[1, 2, 3], [4]]}, "nested 'data'"),
        ({"data": [1, "a", 3, 4]}, "must be numbers"),
        ({"data": [1, None, 3, 4]}, "must be numbers"),
        ({"data": [1, [2], 3, 4]}, "not a list of numbers|mixes"),
        ({"shape": [2, -2]}, "non-negative"),
        ({"shape": "2x2"}, "list of integers"),
        ({"shape": [2.0, 2]}, "non-negative integers"),
        ({"datatype": "FP31"}, "unsupported datatype"),
        ({"data": {"a": 1}}, "must be a list"),
        ({"name": ""}, "no 'name'"),
    ],
)
def test_malformed_tensors_are_refused_with_a_named_reason(fields: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        decode(one_input(**fields))


def test_huge_declared_shape_is_refused_before_any_allocation() -> None:
    with pytest.raises(InvalidInput, match="exceeds the limit"):
        decode(one_input(shape=[1_000_000_000, 64], data=[1.0] * 64))


def test_a_shape_whose_nonzero_dimensions_overflow_is_refused_even_with_no_elements() -> None:
    with pytest.raises(InvalidInput, match=r"shape \[4294967296, 4294967296, 0\] exceeds the limit"):
        decode(one_input(shape=[2**32, 2**32, 0], data=[]))


@pytest.mark.parametrize(
    "body",
    [
        b'{"id":"\\ud800","inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1]}]}',
        b'{"inputs":[{"name":"x","datatype":"BYTES","shape":[1],"data":["\\udfff"]}]}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[NaN]}],"id":"\\ud800"}',
    ],
)
def test_strings_that_are_not_unicode_text_are_refused_while_decoding(body: bytes) -> None:
    with pytest.raises(InvalidInput, match="lone surrogate"):
        decode_infer_request(body, None, "m", None, TensorLimits())


def test_integer_types_are_range_checked() -> None:
    with pytest.raises(InvalidInput, match="out of range"):
        decode(one_input(datatype="UINT8", shape=[1], data=[300]))
    with pytest.raises(InvalidInput, match="must be integers"):
        decode(one_input(datatype="INT32", shape=[1], data=[1.5]))


def test_bool_and_bytes_json_inputs() -> None:
    request = decode(
        {
            "inputs": [
                {"name": "b", "datatype": "BOOL", "shape": [2], "data": [True, False]},
                {"name": "s", "datatype": "BYTES", "shape": [2], "data": ["héllo", ""]},
            ]
        }
    )
    assert request.inputs[0].data.dtype == np.bool_
    assert list(request.inputs[1].data) == ["héllo", ""]


def test_nan_and_infinity_are_data() -> None:
    body = b'{"inputs":[{"name":"x","datatype":"FP64","shape":[3],"data":[NaN, Infinity, -Infinity]}]}'
    request = decode_infer_request(body, None, "m", None, LIMITS)
    data = request.inputs[0].data
    assert np.isnan(data[0]) and np.isposinf(data[1]) and np.isneginf(data[2])


def test_binary_input_is_a_view_of_the_body() -> None:
    payload = np.arange(4, dtype=np.float32).tobytes()
    tensor = {"name": "x", "datatype": "FP32", "shape": [2, 2], "parameters": {"binary_data_size": 16}}
    request = decode({"inputs": [tensor]}, payload)
    array = request.inputs[0].data
    np.testing.assert_array_equal(array, [[0, 1], [2, 3]])
    assert not array.flags.owndata


def test_binary_size_must_match_the_shape() -> None:
    tensor = {"name": "x", "datatype": "FP32", "shape": [2, 2], "parameters": {"binary_data_size": 12}}
    with pytest.raises(InvalidInput, match="12 bytes"):
        decode({"inputs": [tensor]}, b"\0" * 12)


def test_binary_data_past_the_end_is_refused() -> None:
    tensor = {"name": "x", "datatype": "FP32", "shape": [2, 2], "parameters": {"binary_data_size": 16}}
    with pytest.raises(InvalidInput, match="past the end"):
        decode({"inputs": [tensor]}, b"\0" * 8)


def test_unclaimed_binary_bytes_are_refused() -> None:
    tensor = {"name": "x", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": 4}}
    with pytest.raises(InvalidInput, match="not claimed"):
        decode({"inputs": [tensor]}, b"\0" * 8)


def test_binary_bytes_elements_are_bounds_checked() -> None:
    good = struct.pack("<I", 2) + b"hi" + struct.pack("<I", 0)
    tensor = {"name": "s", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": len(good)}}
    request = decode({"inputs": [tensor]}, good)
    assert list(request.inputs[0].data) == [b"hi", b""]
    lying = struct.pack("<I", 1_000_000) + b"hi" + struct.pack("<I", 0)
    tensor["parameters"] = {"binary_data_size": len(lying)}
    with pytest.raises(InvalidInput, match="longer than the limit|past the end"):
        decode({"inputs": [tensor]}, lying)
    too_few = struct.pack("<I", 2) + b"hi"  # 6 bytes cannot hold two 4-byte lengths
    tensor["parameters"] = {"binary_data_size": len(too_few)}
    with pytest.raises(InvalidInput, match="6 bytes of BYTES data hold at most 1 elements"):
        decode({"inputs": [tensor]}, too_few)


def test_header_length_larger_than_body_is_refused() -> None:
    with pytest.raises(InvalidInput, match="Inference-Header-Content-Length"):
        decode_infer_request(b"{}", 10, "m", None, LIMITS)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[1,2]",
        b'{"inputs": []}',
        b'{"inputs": [1]}',
        b'{"id": 5, "inputs": []}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1]}],"parameters":{"a":[1]}}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1]}],"parameters":{"priority":-1}}',
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1]}],"outputs":[{"nam":"y"}]}',
        b"[" * 100000 + b"]" * 100000,
    ],
)
def test_malformed_documents_are_invalid_input(body: bytes) -> None:
    with pytest.raises(InvalidInput):
        decode_infer_request(body, None, "m", None, LIMITS)


def test_schedule_policy_parameters_are_read() -> None:
    request = decode(one_input() | {"parameters": {"priority": 2, "timeout": 1500}})
    assert request.priority == 2 and request.timeout_s == pytest.approx(0.0015)


def test_response_json_and_binary_outputs() -> None:
    out = np.arange(4, dtype=np.float32).reshape(2, 2)
    response = InferResponse(
        "m",
        "1",
        [InferOutput("a", "FP32", (2, 2), out), InferOutput("b", "FP32", (2, 2), out, {"binary_data": True})],
        id="req-1",
    )
    encoded = encode_infer_response(response, binary_default=False)
    assert encoded.header_length is not None
    header = orjson.loads(bytes(encoded.chunks[0]))
    assert header["id"] == "req-1"
    assert header["outputs"][0]["data"] == [0, 1, 2, 3]
    assert header["outputs"][1]["parameters"]["binary_data_size"] == 16
    tail = b"".join(bytes(c) for c in encoded.chunks[1:])
    np.testing.assert_array_equal(np.frombuffer(tail, np.float32), [0, 1, 2, 3])


def test_non_finite_outputs_are_strict_json_strings_not_null_or_bare_tokens() -> None:
    out = np.array([np.nan, np.inf, -np.inf, 1.0], dtype=np.float32)
    encoded = encode_infer_response(InferResponse("m", "1", [InferOutput("a", "FP32", (4,), out)]), False)
    # orjson is a strict parser (bare NaN tokens are refused), as JSON.parse is.
    data = orjson.loads(bytes(encoded.chunks[0]))["outputs"][0]["data"]
    assert data == ["NaN", "Infinity", "-Infinity", 1.0]
    np.testing.assert_array_equal(np.array(data, dtype=np.float32), out)  # tritonclient's as_numpy


def test_non_finite_inputs_are_read_from_strict_json_strings() -> None:
    request = decode(one_input(datatype="FP32", shape=[3], data=["NaN", "Infinity", -1.5]))
    data = request.inputs[0].data
    assert np.isnan(data[0]) and data[1] == np.inf and data[2] == -1.5


def test_other_strings_in_float_data_are_refused_naming_them() -> None:
    with pytest.raises(InvalidInput, match="found 'nan'"):
        decode(one_input(datatype="FP32", shape=[2], data=["nan", 1.0]))


def test_bf16_json_numbers_become_bit_patterns_rounded_to_nearest_even() -> None:
    data = [1.0, 0.1, 1.00390625, 1.01171875, -2, float("nan"), 1e39, 0]
    request = decode(one_input(datatype="BF16", shape=[2, 4], data=data))
    array = request.inputs[0].data
    assert array.dtype == np.uint16 and array.shape == (2, 4)
    # 1.00390625 and 1.01171875 are ties: to the even 0x3F80, and up to the even 0x3F82.
    assert array.reshape(-1).tolist() == [0x3F80, 0x3DCD, 0x3F80, 0x3F82, 0xC000, 0x7FC0, 0x7F80, 0x0000]


@pytest.mark.parametrize("data", [[True, False, True, False], ["1", "2", "3", "4"]])
def test_bf16_json_data_must_be_numbers(data: list[object]) -> None:
    with pytest.raises(InvalidInput, match="BF16 data must be numbers"):
        decode(one_input(datatype="BF16", data=data))


def test_bf16_binary_input_is_two_little_endian_bytes_an_element() -> None:
    def document(size: int) -> dict[str, object]:
        tensor = {"name": "x", "datatype": "BF16", "shape": [3], "parameters": {"binary_data_size": size}}
        return {"inputs": [tensor]}

    request = decode(document(6), b"\x80\x3f\xc0\xbf\xc0\x7f")
    array = request.inputs[0].data
    assert array.dtype == np.uint16
    assert array.tolist() == [0x3F80, 0xBFC0, 0x7FC0]
    with pytest.raises(InvalidInput, match="8 bytes of binary data, shape \\[3\\] of BF16 needs 6"):
        decode(document(8), b"\x80\x3f\xc0\xbf\xc0\x7f\x00\x00")


def test_bf16_outputs_are_numbers_in_json_and_raw_bits_in_binary() -> None:
    bits = np.array([0x3F80, 0xC040, 0x7FC0, 0x3E4D], dtype=np.uint16)
    response = InferResponse(
        "m",
        "1",
        [InferOutput("a", "BF16", (4,), bits), InferOutput("b", "BF16", (4,), bits, {"binary_data": True})],
    )
    encoded = encode_infer_response(response, binary_default=False)
    header = json.loads(bytes(encoded.chunks[0]))
    first = header["outputs"][0]["data"]
    assert first[:2] == [1.0, -3.0] and first[2] == "NaN" and first[3] == 0.2001953125
    assert header["outputs"][1]["datatype"] == "BF16"
    assert header["outputs"][1]["parameters"]["binary_data_size"] == 8
    assert b"".join(bytes(c) for c in encoded.chunks[1:]) == b"\x80\x3f\x40\xc0\xc0\x7f\x4d\x3e"


def shm_input(**fields: object) -> dict[str, object]:
    parameters = {"shared_memory_region": "r", "shared_memory_byte_size": 16, "shared_memory_offset": 4}
    document = one_input(parameters=parameters, **fields)
    if "data" not in fields:
        del document["inputs"][0]["data"]  # type: ignore[index]
    return document


def test_an_input_in_shared_memory_is_a_view_of_the_region(block: shared_memory.SharedMemory) -> None:
    regions = SharedMemoryRegistry(1)
    regions.register("r", key_of(block), 0, 64)
    header = json.dumps(shm_input()).encode()
    buffer_of(block)[4:20] = np.arange(4, dtype=np.float32).tobytes()
    array = decode_infer_request(header, None, "m", None, LIMITS, regions).inputs[0].data
    np.testing.assert_array_equal(array, [[0, 1], [2, 3]])
    buffer_of(block)[4:8] = np.float32(7).tobytes()
    assert array[0, 0] == 7  # no copy: the client's later writes show through


def test_an_input_with_a_region_and_data_of_its_own_is_refused(block: shared_memory.SharedMemory) -> None:
    regions = SharedMemoryRegistry(1)
    regions.register("r", key_of(block), 0, 64)
    header = json.dumps(shm_input(data=[1, 2, 3, 4])).encode()
    with pytest.raises(InvalidInput, match="has a shared-memory region and data of its own"):
        decode_infer_request(header, None, "m", None, LIMITS, regions)


def test_an_output_in_shared_memory_is_answered_without_data() -> None:
    parameters = {"shared_memory_region": "r", "shared_memory_byte_size": 8}
    output = InferOutput("y", "FP32", (2,), np.zeros(2, np.float32), parameters)  # type: ignore[arg-type]
    encoded = encode_infer_response(InferResponse("m", "1", [output]), binary_default=True)
    assert encoded.header_length is None
    assert orjson.loads(b"".join(encoded.chunks))["outputs"] == [
        {"name": "y", "datatype": "FP32", "shape": [2], "parameters": parameters}
    ]


def test_a_request_reencoded_for_capture_carries_its_shared_memory_input_inline(
    block: shared_memory.SharedMemory,
) -> None:
    regions = SharedMemoryRegistry(1)
    regions.register("r", key_of(block), 0, 64)
    buffer_of(block)[4:20] = np.arange(4, dtype=np.float32).tobytes()
    request = decode_infer_request(json.dumps(shm_input()).encode(), None, "m", None, LIMITS, regions)
    encoded = encode_infer_request(request)
    body = b"".join(bytes(chunk) for chunk in encoded.chunks)
    replayed = decode_infer_request(body, encoded.header_length, "m", None, LIMITS)
    assert replayed.inputs[0].parameters == {"binary_data_size": 16}
    np.testing.assert_array_equal(replayed.inputs[0].data, [[0, 1], [2, 3]])
