"""End to end with KServe's own Python client (``kserve``): health, model readiness and infer on
both transports, as a KServe user (or KServe's graph router) would call the server."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig

from model_builders import mlp_reference
from ortserve.testing import ServerProcess

pytestmark = pytest.mark.e2e


def request(data: np.ndarray, request_id: str, binary: bool = False) -> InferRequest:
    tensor = InferInput("input", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data, binary_data=binary)
    return InferRequest(model_name="small_mlp", infer_inputs=[tensor], request_id=request_id)


@pytest.fixture
def data() -> np.ndarray:
    return np.random.default_rng(11).standard_normal((3, 64)).astype(np.float32)


async def test_the_rest_client_sees_a_live_ready_server_and_model(server: ServerProcess) -> None:
    client = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=30))
    try:
        assert await client.is_server_live(server.http_url) is True
        assert await client.is_server_ready(server.http_url) is True
        assert await client.is_model_ready(server.http_url, "small_mlp") is True
    finally:
        await client.close()


@pytest.mark.parametrize("binary", [False, True])
async def test_the_rest_client_infers(
    server: ServerProcess, demo_repository: Path, data: np.ndarray, binary: bool
) -> None:
    client = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=30))
    try:
        answer = await client.infer(server.http_url, request(data, "kserve-rest", binary), "small_mlp")
    finally:
        await client.close()
    assert answer.id == "kserve-rest"
    expected = mlp_reference(demo_repository / "small_mlp" / "1" / "model.onnx", data)
    np.testing.assert_allclose(answer.outputs[0].as_numpy(), expected, rtol=1e-4, atol=1e-4)


async def test_the_grpc_client_sees_a_ready_server_and_infers(
    server: ServerProcess, demo_repository: Path, data: np.ndarray
) -> None:
    client = InferenceGRPCClient(server.grpc_address)
    try:
        assert await client.is_server_live() is True
        assert await client.is_server_ready() is True
        assert await client.is_model_ready("small_mlp") is True
        answer = await client.infer(request(data, "kserve-grpc"))
    finally:
        await client.close()
    assert answer.id == "kserve-grpc"
    expected = mlp_reference(demo_repository / "small_mlp" / "1" / "model.onnx", data)
    np.testing.assert_allclose(answer.outputs[0].as_numpy(), expected, rtol=1e-4, atol=1e-4)
