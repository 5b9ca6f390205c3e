"""Fallback end to end: degraded marks on every transport, readiness both ways, no usable level,
strict providers, the input sandbox, metadata, index and metrics, on one real server."""

from __future__ import annotations

import contextlib
import json
import queue
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from model_builders import write_scaled_version
from ortserve.testing import ServerProcess, run_server

pytestmark = pytest.mark.e2e

X = np.arange(8, dtype=np.float32).reshape(2, 4)
BROKEN_L0 = "faults:\n  L0: {error_rate: 1.0}\n"
CONFIGS = {
    # L0 always fails: answered by the CPU fallback session, degraded, 206 asked for.
    "degraded": BROKEN_L0 + "fallback:\n  degraded_status: 206\n  breaker: {consecutive_failures: 1}\n"
    "inputs:\n  x: {max: 100, allow_nan: false}\n",
    # The same, but not ready while degraded.
    "unready": BROKEN_L0 + "fallback:\n  ready_when_degraded: false\n  breaker: {consecutive_failures: 1}\n",
    # No level but L0: once it opens there is nothing left.
    "lonely": BROKEN_L0 + "fallback:\n  session: none\n  breaker: {consecutive_failures: 1, open_s: 60}\n",
    # GPU only on a machine without one.
    "strict": "providers: [CUDAExecutionProvider]\nproviders_strict: true\n",
    "healthy": "fallback: {}\n",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("fallback-models")
    for name, config in CONFIGS.items():
        write_scaled_version(root, name, 1, 2.0)
        (root / name / "config.yaml").write_text(config, encoding="utf-8")
    log = tmp_path_factory.mktemp("fallback-logs") / "server.log"
    args = ["--enable-fault-injection", "--no-strict-readiness", "--intra-op-threads", "1"]
    with run_server(root, log, args) as process:
        yield process


def post(server: ServerProcess, model: str, document: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    path = f"/v2/models/{model}/versions/1/infer"  # an unready version is not picked without it
    request = urllib.request.Request(f"{server.http_url}{path}", json.dumps(document).encode())
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, dict(reply.headers.items()), json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers.items()), json.loads(error.read())


def tensor(data: list[float | str], shape: list[int]) -> dict[str, Any]:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": shape, "data": data}]}


def get(server: ServerProcess, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"{server.http_url}{path}", timeout=30) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_http_json_answers_are_right_and_marked_degraded(server: ServerProcess) -> None:
    status, headers, body = post(server, "degraded", tensor(list(X.reshape(-1).tolist()), [2, 4]))
    assert status == 206
    assert body["outputs"][0]["data"] == (X * 2).reshape(-1).tolist()
    assert body["parameters"]["degraded"] is True and body["parameters"]["fallback_level"] == 2
    assert "injected persistent fault on L0 primary" in body["parameters"]["fallback_reason"]
    assert headers["x-ortserve-degraded"].startswith("level=2; reason=")


def test_http_binary_answers_carry_the_mark_in_parameters(server: ServerProcess) -> None:
    with contextlib.closing(httpclient.InferenceServerClient(server.http_address)) as client:
        given = httpclient.InferInput("x", [2, 4], "FP32")
        given.set_data_from_numpy(X, binary_data=True)
        # tritonclient decodes binary answers only with status 200: hence 200 is the default.
        wanted = [httpclient.InferRequestedOutput("y", binary_data=True)]
        result = client.infer("unready", [given], outputs=wanted, model_version="1")
    np.testing.assert_array_equal(result.as_numpy("y"), X * 2)
    assert result.get_response()["parameters"]["fallback_level"] == 2


def test_grpc_unary_answers_carry_parameters_and_trailing_metadata(server: ServerProcess) -> None:
    request = service_pb2.ModelInferRequest(model_name="degraded")
    request.inputs.add(name="x", datatype="FP32", shape=[2, 4])
    request.raw_input_contents.append(X.tobytes())
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        answer, call = stub.ModelInfer.with_call(request, timeout=30)
        healthy = service_pb2.ModelInferRequest(model_name="healthy", inputs=request.inputs)
        healthy.raw_input_contents.append(X.tobytes())
        _, plain_call = stub.ModelInfer.with_call(healthy, timeout=30)
    np.testing.assert_array_equal(
        np.frombuffer(answer.raw_output_contents[0], np.float32), (X * 2).reshape(-1)
    )
    assert answer.parameters["degraded"].bool_param is True
    assert answer.parameters["fallback_level"].int64_param == 2
    trailing = dict(call.trailing_metadata())
    assert trailing["x-ortserve-degraded"].startswith("level=2; reason=")
    assert "x-ortserve-degraded" not in dict(plain_call.trailing_metadata())


def test_grpc_stream_answers_carry_the_mark(server: ServerProcess) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_address)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        given = grpcclient.InferInput("x", [2, 4], "FP32")
        given.set_data_from_numpy(X)
        client.async_stream_infer("degraded", [given], request_id="s1")
        result, error = answers.get(timeout=30)
    finally:
        client.stop_stream()
        client.close()
    assert error is None
    np.testing.assert_array_equal(result.as_numpy("y"), X * 2)
    assert result.get_response().parameters["fallback_level"].int64_param == 2


def test_readiness_when_degraded_follows_the_config(server: ServerProcess) -> None:
    post(server, "unready", tensor([1, 2, 3, 4], [1, 4]))
    assert get(server, "/v2/models/degraded/ready")[0] == 200
    assert get(server, "/v2/models/unready/ready")[0] != 200
    assert get(server, "/v2/models/healthy/ready")[0] == 200
    status, _, body = post(server, "unready", tensor([1, 2, 3, 4], [1, 4]))
    assert status == 200 and body["outputs"][0]["data"] == [2, 4, 6, 8]  # named, still answered, marked
    assert body["parameters"]["degraded"] is True
    assert get(server, "/v2/models/healthy/ready")[0] == 200
    unnamed = urllib.request.Request(
        f"{server.http_url}/v2/models/unready/infer", json.dumps(tensor([1, 2, 3, 4], [1, 4])).encode()
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(unnamed, timeout=30)
    assert caught.value.code == 503
    with caught.value:  # the error holds the answer's socket
        message = json.loads(caught.value.read())["error"]
    assert message.startswith("model 'unready' has no ready version: version 1: fallback level 2: L0 primary")


def test_a_version_without_a_usable_level_answers_503_with_the_reason(server: ServerProcess) -> None:
    first, _, body = post(server, "lonely", tensor([1, 2, 3, 4], [1, 4]))
    assert first == 503 and "injected persistent fault" in body["error"]  # could not be retried
    status, _, body = post(server, "lonely", tensor([1, 2, 3, 4], [1, 4]))
    assert status == 503
    assert "has no usable execution level" in body["error"] and "circuit open" in body["error"]
    assert get(server, "/v2/models/lonely/ready")[0] != 200


def test_strict_providers_fail_the_load_with_the_reason(server: ServerProcess) -> None:
    with contextlib.closing(httpclient.InferenceServerClient(server.http_address)) as client:
        rows = {row["name"]: row for row in client.get_model_repository_index()}
    assert rows["strict"]["state"] == "UNAVAILABLE"
    assert (
        "providers_strict" in rows["strict"]["reason"] and "CUDAExecutionProvider" in rows["strict"]["reason"]
    )
    assert rows["degraded"]["state"] == "READY" and rows["degraded"]["reason"].startswith("fallback level 2")
    assert rows["healthy"]["reason"] == ""


def test_the_sandbox_refuses_naming_the_element_on_both_transports(server: ServerProcess) -> None:
    status, _, body = post(server, "degraded", tensor([1, 2, 1e300, 4], [1, 4]))
    assert status == 400
    assert body["error"] == "input 'x': element [0, 2] is inf: above the maximum 100"  # 1e300 as FP32
    status, _, body = post(server, "degraded", tensor([1, "NaN", 3, 4], [1, 4]))
    assert status == 400 and body["error"] == "input 'x': element [0, 1] is nan: NaN is not allowed"
    with contextlib.closing(grpcclient.InferenceServerClient(server.grpc_address)) as client:
        given = grpcclient.InferInput("x", [1, 4], "FP32")
        given.set_data_from_numpy(np.array([[1, 2, 3, 400]], dtype=np.float32))
        with pytest.raises(Exception, match=r"element \[0, 3\] is 400.0: above the maximum 100"):
            client.infer("degraded", [given])


def test_metadata_and_metrics_show_the_level(server: ServerProcess) -> None:
    post(server, "degraded", tensor([1, 2, 3, 4], [1, 4]))
    metadata = json.loads(get(server, "/v2/models/degraded")[1])
    assert metadata["parameters"]["fallback_level"] == 2
    assert "parameters" in json.loads(get(server, "/v2/models/healthy")[1])
    metrics = get(server, "/metrics")[1].decode()
    assert 'ortserve_fallback_level{model="degraded",version="1"} 2.0' in metrics
    assert 'ortserve_fallback_level{model="healthy",version="1"} 0.0' in metrics
    assert 'ortserve_fallback_transitions_total{from="0",model="degraded",to="2",version="1"}' in metrics


def test_the_log_names_each_transition_and_its_cause(server: ServerProcess) -> None:
    post(server, "degraded", tensor([1, 2, 3, 4], [1, 4]))
    log = Path(server.log_path).read_text(encoding="utf-8")
    assert "model 'degraded' version 1: traffic moved from level 0 to level 2 (L0 primary: injected" in log
    assert "L0 primary circuit opened" in log
