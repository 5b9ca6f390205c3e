"""End to end over gRPC with tritonclient.grpc: raw and typed tensors, streaming, health, reflection."""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from model_builders import mlp_reference
from ortserve.testing import ServerProcess

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    with contextlib.closing(grpcclient.InferenceServerClient(server.grpc_address)) as opened:
        yield opened


@pytest.fixture(scope="module")
def channel(server: ServerProcess) -> grpc.Channel:
    return grpc.insecure_channel(server.grpc_address)


def mlp_input(data: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("input", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return tensor


def reference(demo_repository: Path, model: str, data: np.ndarray) -> np.ndarray:
    return mlp_reference(demo_repository / model / "1" / "model.onnx", data)


@pytest.mark.parametrize(("model", "width"), [("small_mlp", 64), ("heavy_mlp", 512)])
def test_raw_input_contents_infer_matches_numpy(
    client: grpcclient.InferenceServerClient, demo_repository: Path, model: str, width: int
) -> None:
    data = np.random.default_rng(3).standard_normal((3, width)).astype(np.float32)
    result = client.infer(model, [mlp_input(data)], request_id="r-1")
    assert result.get_response().id == "r-1"
    assert len(result.get_response().raw_output_contents) == 1
    np.testing.assert_allclose(result.as_numpy("output"), reference(demo_repository, model, data), atol=1e-4)


def test_typed_fp32_contents_are_accepted(channel: grpc.Channel, demo_repository: Path) -> None:
    data = np.random.default_rng(4).standard_normal((2, 64)).astype(np.float32)
    request = service_pb2.ModelInferRequest(model_name="small_mlp")
    tensor = request.inputs.add(name="input", datatype="FP32", shape=[2, 64])
    tensor.contents.fp32_contents.extend(data.reshape(-1).tolist())
    response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    got = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(2, 16)
    np.testing.assert_allclose(got, reference(demo_repository, "small_mlp", data), atol=1e-4)


def test_metadata_and_readiness(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("small_mlp") and client.is_model_ready("small_mlp", "1")
    metadata = client.get_model_metadata("heavy_mlp")
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [("input", "FP32", [-1, 512])]
    assert client.get_server_metadata().name == "ortserve"


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.get_system_shared_memory_status(),
    ],
)
def test_calls_not_offered_answer_unimplemented(client: grpcclient.InferenceServerClient, call: Any) -> None:
    with pytest.raises(InferenceServerException) as caught:
        call(client)
    assert caught.value.status() == "StatusCode.UNIMPLEMENTED"
    assert client.is_server_ready()


def test_statistics_count_grpc_requests_and_agree_with_http(
    client: grpcclient.InferenceServerClient, server: ServerProcess
) -> None:
    before = client.get_inference_statistics("heavy_mlp", as_json=True)["model_stats"][0]
    for _ in range(3):
        client.infer("heavy_mlp", [mlp_input(np.ones((2, 512), np.float32))])
    stats = client.get_inference_statistics("heavy_mlp", as_json=True)["model_stats"][0]
    success = int(stats["inference_stats"]["success"]["count"])
    assert success == int(before["inference_stats"].get("success", {}).get("count", 0)) + 3
    assert int(stats["inference_count"]) >= 6 and stats["batch_stats"]
    with contextlib.closing(httpclient.InferenceServerClient(server.http_address)) as http:
        http_stats = http.get_inference_statistics("heavy_mlp")
    assert http_stats["model_stats"][0]["inference_stats"]["success"]["count"] == success
    with pytest.raises(InferenceServerException) as caught:
        client.get_inference_statistics("no_such_model")
    assert caught.value.status() == "StatusCode.NOT_FOUND"


def test_streaming_answers_every_request_by_id_and_survives_errors(
    client: grpcclient.InferenceServerClient, demo_repository: Path
) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        data = {f"req-{i}": np.full((1 + i % 3, 64), i / 10, np.float32) for i in range(12)}
        for request_id, array in list(data.items())[:6]:
            client.async_stream_infer("small_mlp", [mlp_input(array)], request_id=request_id)
        bad = grpcclient.InferInput("nope", [1, 64], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 64), np.float32))
        client.async_stream_infer("small_mlp", [bad], request_id="bad")
        for request_id, array in list(data.items())[6:]:
            client.async_stream_infer("small_mlp", [mlp_input(array)], request_id=request_id)
        results = {}
        errors = []
        for _ in range(len(data) + 1):
            result, error = answers.get(timeout=30)
            if error is not None:
                errors.append(error)
            else:
                results[result.get_response().id] = result.as_numpy("output")
    finally:
        client.stop_stream()
    assert len(errors) == 1 and "unexpected input 'nope'" in errors[0].message()
    assert set(results) == set(data)
    for request_id, array in data.items():
        expected = reference(demo_repository, "small_mlp", array)
        np.testing.assert_allclose(results[request_id], expected, atol=1e-4)


def test_stream_errors_carry_the_request_id(channel: grpc.Channel) -> None:
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    good = service_pb2.ModelInferRequest(model_name="small_mlp", id="good")
    good.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    good.raw_input_contents.append(np.zeros(64, np.float32).tobytes())
    unknown = service_pb2.ModelInferRequest(model_name="nope", id="lost")
    unknown.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    unknown.raw_input_contents.append(np.zeros(64, np.float32).tobytes())
    answers = list(stub.ModelStreamInfer(iter([unknown, good]), timeout=30))
    by_id = {a.infer_response.id: a for a in answers}
    assert set(by_id) == {"lost", "good"}
    assert by_id["lost"].error_message == "unknown model 'nope'"
    assert by_id["good"].error_message == "" and len(by_id["good"].infer_response.raw_output_contents) == 1


def test_health_service_reflects_readiness(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    serving = health_pb2.HealthCheckResponse.SERVING
    for service in ("", "inference.GRPCInferenceService", "small_mlp"):
        assert health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status == serving
    with pytest.raises(grpc.RpcError) as caught:
        health.Check(health_pb2.HealthCheckRequest(service="no_such_model"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert next(watch).status == serving
    watch.cancel()


def test_reflection_lists_and_describes_the_services(channel: grpc.Channel) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    requests = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="inference.ModelInferRequest"),
    ]
    listed, described = list(stub.ServerReflectionInfo(iter(requests), timeout=10))
    names = {s.name for s in listed.list_services_response.service}
    assert {"inference.GRPCInferenceService", "grpc.health.v1.Health"} <= names
    assert described.file_descriptor_response.file_descriptor_proto


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
def test_reflection_answers_under_both_service_names(channel: grpc.Channel, version: str) -> None:
    # grpcurl asks v1 first; v1 and v1alpha messages are the same on the wire.
    info = channel.stream_stream(
        f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    requests = [
        reflection_pb2.ServerReflectionRequest(file_by_filename="ortserve/protocol/grpc/grpc_service.proto"),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="no.such.Symbol"),
    ]
    found, missing = list(info(iter(requests), timeout=10))
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in found.file_descriptor_response.file_descriptor_proto
    ]
    assert any(f.package == "inference" and f.service[0].name == "GRPCInferenceService" for f in files)
    assert missing.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
