"""BF16 end to end: numbers in JSON, exact bit patterns in HTTP binary and gRPC raw contents."""

from __future__ import annotations

import contextlib
import http.client
import json
from typing import Any

import grpc
import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ortserve.testing import ServerProcess

pytestmark = pytest.mark.e2e

# Bit patterns, including the ones float arithmetic cannot compare: NaN, infinities, -0.
X_BITS = np.array([[0x3F80, 0xBFC0, 0x3DCD, 0x7FC0], [0x7F80, 0xFF80, 0x8000, 0x0001]], dtype=np.uint16)
# x * 2 in bfloat16: the exponent goes up by one (0x0080); specials stay; the subnormal doubles.
Y_BITS = np.array([[0x4000, 0xC040, 0x3E4D, 0x7FC0], [0x7F80, 0xFF80, 0x8000, 0x0002]], dtype=np.uint16)


def post_json(server: ServerProcess, document: object) -> tuple[int, dict[str, Any]]:
    connection = http.client.HTTPConnection(server.host, server.http_port, timeout=30)
    try:
        connection.request("POST", "/v2/models/bf16/infer", json.dumps(document).encode())
        reply = connection.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        connection.close()


def test_json_bf16_data_is_numbers_rounded_to_nearest_even(error_repository_server: ServerProcess) -> None:
    # 0.1 rounds to 0.10009765625; 1.01171875 is a tie and rounds up to the even 1.015625.
    data = [[0.1, 1.01171875, -2.0, 1e39], [0.0, 3.0, float("nan"), -1e-3]]
    tensor = {"name": "x", "datatype": "BF16", "shape": [2, 4], "data": data}
    status, answer = post_json(error_repository_server, {"inputs": [tensor], "outputs": [{"name": "y"}]})
    assert status == 200, answer
    (output,) = answer["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("y", "BF16", [2, 4])
    values = output["data"]
    assert values[:4] == [0.2001953125, 2.03125, -4.0, "Infinity"]  # strict JSON (docs/resilience.md)
    assert values[4:6] == [0.0, 6.0] and values[6] == "NaN" and values[7] == -0.0019989013671875


def test_json_bf16_data_must_be_numbers(error_repository_server: ServerProcess) -> None:
    tensor = {"name": "x", "datatype": "BF16", "shape": [1, 4], "data": ["a", "b", "c", "d"]}
    status, answer = post_json(error_repository_server, {"inputs": [tensor]})
    assert status == 400
    assert "BF16 data must be numbers" in str(answer["error"])


def test_http_binary_bf16_keeps_exact_bit_patterns(error_repository_server: ServerProcess) -> None:
    with contextlib.closing(httpclient.InferenceServerClient(error_repository_server.http_address)) as client:
        tensor = httpclient.InferInput("x", [2, 4], "BF16")
        tensor.set_data_from_numpy(X_BITS.view(ml_dtypes.bfloat16), binary_data=True)
        wanted = [httpclient.InferRequestedOutput("y", binary_data=True)]
        result = client.infer("bf16", [tensor], outputs=wanted)
    assert result.get_response()["outputs"][0]["parameters"]["binary_data_size"] == 16
    np.testing.assert_array_equal(result.as_numpy("y").view(np.uint16), Y_BITS)


def test_grpc_raw_contents_bf16_keeps_exact_bit_patterns(error_repository_server: ServerProcess) -> None:
    with contextlib.closing(grpcclient.InferenceServerClient(error_repository_server.grpc_address)) as client:
        tensor = grpcclient.InferInput("x", [2, 4], "BF16")
        tensor.set_data_from_numpy(X_BITS.view(ml_dtypes.bfloat16))
        result = client.infer("bf16", [tensor], outputs=[grpcclient.InferRequestedOutput("y")])
    assert result.get_response().raw_output_contents[0] == Y_BITS.astype("<u2").tobytes()
    np.testing.assert_array_equal(result.as_numpy("y").view(np.uint16), Y_BITS)


def test_grpc_typed_contents_cannot_carry_bf16(error_repository_server: ServerProcess) -> None:
    request = service_pb2.ModelInferRequest(model_name="bf16")
    request.inputs.add(name="x", datatype="BF16", shape=[1, 4]).contents.fp32_contents.extend([1.0] * 4)
    with grpc.insecure_channel(error_repository_server.grpc_address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "no field for BF16; send its data in raw_input_contents" in str(caught.value.details())
