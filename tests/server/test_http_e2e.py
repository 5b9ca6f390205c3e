"""End to end over HTTP with the official tritonclient: health, metadata, JSON and binary infer."""

from __future__ import annotations

import contextlib
import json
import random
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from model_builders import mlp_reference
from ortserve.testing import ServerProcess

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    with contextlib.closing(httpclient.InferenceServerClient(server.http_address, concurrency=16)) as opened:
        yield opened


def infer(client: httpclient.InferenceServerClient, model: str, data: np.ndarray, binary: bool) -> np.ndarray:
    tensor = httpclient.InferInput("input", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data, binary_data=binary)
    wanted = httpclient.InferRequestedOutput("output", binary_data=binary)
    result = client.infer(model, [tensor], outputs=[wanted])
    output: np.ndarray = result.as_numpy("output")
    return output


def test_health_and_server_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    metadata = client.get_server_metadata()
    assert metadata["name"] == "ortserve"
    assert "binary_tensor_data" in metadata["extensions"]


def test_model_metadata_comes_from_the_graph(client: httpclient.InferenceServerClient) -> None:
    metadata = client.get_model_metadata("small_mlp")
    assert metadata["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    assert metadata["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 16]}]
    assert client.is_model_ready("small_mlp")
    assert client.is_model_ready("small_mlp", "1")


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize(("model", "width"), [("small_mlp", 64), ("heavy_mlp", 512)])
def test_infer_matches_numpy(
    client: httpclient.InferenceServerClient, demo_repository: Path, model: str, width: int, binary: bool
) -> None:
    data = np.random.default_rng(7).standard_normal((3, width)).astype(np.float32)
    got = infer(client, model, data, binary)
    expected = mlp_reference(demo_repository / model / "1" / "model.onnx", data)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_request_id_is_echoed_and_version_can_be_named(server: ServerProcess) -> None:
    body = {
        "id": "abc-1",
        "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}],
    }
    request = urllib.request.Request(
        f"{server.http_url}/v2/models/small_mlp/versions/1/infer", json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        answer = json.loads(reply.read())
    assert answer["id"] == "abc-1"
    assert answer["model_version"] == "1"
    assert answer["outputs"][0]["shape"] == [1, 16]


def test_binary_data_output_parameter_returns_every_output_binary(server: ServerProcess) -> None:
    body = {
        "inputs": [{"name": "input", "shape": [2, 64], "datatype": "FP32", "data": [0.25] * 128}],
        "parameters": {"binary_data_output": True},
    }
    request = urllib.request.Request(
        f"{server.http_url}/v2/models/small_mlp/infer", json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        header_length = int(reply.headers["Inference-Header-Content-Length"])
        raw = reply.read()
    header = json.loads(raw[:header_length])
    assert header["outputs"][0]["parameters"]["binary_data_size"] == 2 * 16 * 4
    assert np.frombuffer(raw[header_length:], np.float32).shape == (32,)


def test_concurrent_requests_each_get_their_own_rows(server: ServerProcess, demo_repository: Path) -> None:
    rng = random.Random(3)
    reference_path = demo_repository / "small_mlp" / "1" / "model.onnx"
    jobs = []
    for index in range(300):
        rows = rng.randint(1, 6)
        data = np.full((rows, 64), 0.0, dtype=np.float32)
        data[:, 0] = index  # every request's rows are unique to it
        data[:, 1] = np.arange(rows)
        jobs.append((data, rng.random() < 0.5))

    def run(job: tuple[np.ndarray, bool]) -> tuple[np.ndarray, np.ndarray]:
        data, binary = job
        local = httpclient.InferenceServerClient(server.http_address)
        try:
            return data, infer(local, "small_mlp", data, binary)
        finally:
            local.close()

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(run, jobs))
    for data, got in results:
        np.testing.assert_allclose(got, mlp_reference(reference_path, data), rtol=1e-4, atol=1e-3)
