"""Every gRPC error path gets its status code from the error tree, and a good call succeeds after."""

from __future__ import annotations

import signal
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import onnx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from onnx import TensorProto, helper, numpy_helper
from tritonclient.grpc import service_pb2, service_pb2_grpc

from model_builders import slow_model, write_error_repository
from ortserve.testing import ServerProcess, run_server

pytestmark = pytest.mark.e2e

MAX_MESSAGE = 1_500_000


@pytest.fixture(scope="module")
def error_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("grpc-error-models")
    write_error_repository(root)
    write_slower_model(root)
    refusing = root / "refusing" / "1"
    refusing.mkdir(parents=True)
    onnx.save(slow_model(matmuls=1, size=8), str(refusing / "model.onnx"))
    # A 1 us budget no run can meet: every call is refused at admission, from its first bytes.
    (root / "refusing" / "config.yaml").write_text(
        "batching:\n  max_batch_size: 4\n  latency_budget_ms: 0.001\n"
    )
    log = tmp_path_factory.mktemp("grpc-error-logs") / "server.log"
    args = ["--no-strict-readiness", "--grpc-max-message-bytes", str(MAX_MESSAGE), "--intra-op-threads", "1"]
    with run_server(root, log, args) as server:
        yield server


def write_slower_model(root: Path) -> None:
    """A model whose run takes hundreds of ms even on many fast cores: a request to it is still
    in flight when a test acts, whatever machine CI draws."""
    slower = root / "slower" / "1"
    slower.mkdir(parents=True)
    onnx.save(slow_model(matmuls=48, size=512), str(slower / "model.onnx"))
    (root / "slower" / "config.yaml").write_text("batching:\n  max_batch_size: 0\n")


@pytest.fixture(scope="module")
def stub(error_server: ServerProcess) -> service_pb2_grpc.GRPCInferenceServiceStub:
    return service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(error_server.grpc_address))


def request(
    model: str, array: np.ndarray, name: str = "x", **parameters: int
) -> service_pb2.ModelInferRequest:
    message = service_pb2.ModelInferRequest(model_name=model)
    message.inputs.add(name=name, datatype="FP32", shape=list(array.shape))
    message.raw_input_contents.append(array.astype(np.float32).tobytes())
    for key, value in parameters.items():
        message.parameters[key].int64_param = value
    return message


def slow_request(**parameters: int) -> service_pb2.ModelInferRequest:
    return request("slow", np.full((1, 256, 256), 0.001, np.float32), "x", **parameters)


def good_call(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    """A call that must succeed: the server kept serving."""
    response = stub.ModelInfer(request("failing", np.arange(12).reshape(3, 4)), timeout=30)
    assert list(response.outputs[0].shape) == [4, 3]


def call_error(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, message: object, **options: object
) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(message, **options)
    return caught.value


@pytest.mark.parametrize(
    ("message", "code", "text"),
    [
        (
            request("failing", np.zeros((3, 4)), name="nope"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "unexpected input",
        ),
        (request("failing", np.zeros((3, 5))), grpc.StatusCode.INVALID_ARGUMENT, "dimension 1"),
        (service_pb2.ModelInferRequest(model_name="failing"), grpc.StatusCode.INVALID_ARGUMENT, "inputs"),
        (request("nope", np.zeros((3, 4))), grpc.StatusCode.NOT_FOUND, "unknown model"),
        (request("broken", np.zeros((3, 4))), grpc.StatusCode.UNAVAILABLE, "broken"),
        (
            request("bad_config", np.zeros((3, 4))),
            grpc.StatusCode.UNAVAILABLE,
            "model 'bad_config' is failed",
        ),
        (request("failing", np.zeros((1, 4))), grpc.StatusCode.INTERNAL, "failed to run this batch"),
        (request("failing", np.zeros((100_000, 4))), grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max"),
    ],
)
def test_each_error_has_its_status_and_the_next_call_succeeds(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, message: object, code: grpc.StatusCode, text: str
) -> None:
    error = call_error(stub, message, timeout=30)
    assert error.code() == code
    assert text in error.details()
    good_call(stub)


def test_runtime_failures_tell_the_client_nothing_of_the_internals(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    error = call_error(stub, request("failing", np.zeros((2, 4))), timeout=30)
    assert error.code() == grpc.StatusCode.INTERNAL
    assert "Traceback" not in error.details() and "onnxruntime" not in error.details().lower()


def test_overload_is_resource_exhausted_with_retry_after(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    with ThreadPoolExecutor(12) as pool:
        calls = [pool.submit(stub.ModelInfer.with_call, slow_request(), timeout=60) for _ in range(12)]
        outcomes = [call.exception() for call in calls]
    refused = [e for e in outcomes if isinstance(e, grpc.RpcError)]
    assert refused and len(refused) < len(outcomes)
    assert {e.code() for e in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert int(dict(refused[0].trailing_metadata())["retry-after"]) >= 1
    good_call(stub)


def test_an_overloaded_model_refuses_before_the_tensors_are_decoded(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    # While "slow" is full, a call whose tensor contents are the wrong size is refused with
    # RESOURCE_EXHAUSTED: decoding it would have answered INVALID_ARGUMENT.
    broken = slow_request()
    broken.raw_input_contents[0] = b"\x00" * 12
    codes = []
    for _ in range(5):  # the queue must still be full when the call lands
        with ThreadPoolExecutor(6) as pool:
            filling = [pool.submit(stub.ModelInfer.with_call, slow_request(), timeout=60) for _ in range(5)]
            codes.append(call_error(stub, broken, timeout=30).code())
            for call in filling:
                call.exception()
        if codes[-1] == grpc.StatusCode.RESOURCE_EXHAUSTED:
            break
    assert codes[-1] == grpc.StatusCode.RESOURCE_EXHAUSTED, codes
    assert call_error(stub, broken, timeout=30).code() == grpc.StatusCode.INVALID_ARGUMENT  # once idle
    good_call(stub)


def test_the_calls_deadline_becomes_the_requests_deadline(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    # With a deadline well under what "slower" takes, the server refuses at admission (it knows
    # the deadline and the model's cost) instead of running work whose answer nobody would wait
    # for. Its time is measured here: on a fast core with two threads it ran in under 60 ms, and
    # a fixed 60 ms deadline let the call succeed.
    started = time.perf_counter()
    stub.ModelInfer(request("slower", np.full((1, 512, 512), 1e-3)), timeout=60)
    deadline_s = min(0.06, (time.perf_counter() - started) / 3)
    details = []
    for _ in range(5):  # on a loaded machine the client's own timer may run out first
        error = call_error(stub, request("slower", np.full((1, 512, 512), 1e-3)), timeout=deadline_s)
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED, error.details()
        details.append(error.details())
        if error.details() != "Deadline Exceeded":  # the server's answer, not the client's timer
            break
    assert "deadline" in details[-1] and details[-1] != "Deadline Exceeded", details
    good_call(stub)


def test_a_deadline_passing_in_the_queue_is_deadline_exceeded(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(stub.ModelInfer, slow_request(), timeout=60)
        second = pool.submit(stub.ModelInfer, slow_request(timeout=2000), timeout=60)
        assert first.result() is not None
        error = second.exception()
    assert isinstance(error, grpc.RpcError)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # at admission or in the queue
    good_call(stub)


def test_shutdown_answers_streamed_requests_in_flight_and_health_goes_not_serving(tmp_path: Path) -> None:
    root = tmp_path / "models"
    write_error_repository(root)
    write_slower_model(root)
    with run_server(root, tmp_path / "server.log", ["--no-strict-readiness"]) as server:
        channel = grpc.insecure_channel(server.grpc_address)
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=60)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        fast = request("failing", np.arange(12).reshape(3, 4))
        fast.id = "fast"
        # 12.9 GFLOP: the small model's answer comes first on any machine (the 24x256 model
        # once finished before it on a fast CI machine).
        slow = request("slower", np.full((1, 512, 512), 0.001, np.float32))
        slow.id = "slow"
        messages = [slow, fast]
        stream = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(
            iter(messages), timeout=60
        )
        first = next(stream)  # the fast answer: the slow request was read before it
        assert first.infer_response.id == "fast"
        server.process.send_signal(signal.SIGTERM)
        rest = list(stream)
        assert [(a.infer_response.id, a.error_message) for a in rest] == [("slow", "")]
        assert [r.status for r in watch] == [health_pb2.HealthCheckResponse.NOT_SERVING]
        assert server.process.wait(30) == 0


def test_an_overloaded_model_refuses_from_the_messages_first_bytes_without_parsing_it(
    error_server: ServerProcess, stub: service_pb2_grpc.GRPCInferenceServiceStub
) -> None:
    # The model name, then bytes no protobuf parser accepts: the refusal never reads them.
    prefix = service_pb2.ModelInferRequest(model_name="refusing", model_version="1").SerializeToString()
    call = grpc.insecure_channel(error_server.grpc_address).unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=lambda raw: raw,
        response_deserializer=service_pb2.ModelInferResponse.FromString,
    )
    for _ in range(3):  # a kept verdict answers the later ones
        with pytest.raises(grpc.RpcError) as caught:
            call(prefix + b"\xff\xff\xff\xff", timeout=30, metadata=(("x", "y"),))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, caught.value.details()
        assert "deadline" in caught.value.details()
        trailing = dict(caught.value.trailing_metadata() or ())
        assert int(trailing["retry-after"]) >= 1
    # The same garbage for a model that admits it takes the full path: a parse error.
    garbage = service_pb2.ModelInferRequest(model_name="slow").SerializeToString() + b"\xff\xff\xff\xff"
    with pytest.raises(grpc.RpcError) as parsed:
        call(garbage, timeout=30)
    assert parsed.value.code() == grpc.StatusCode.INVALID_ARGUMENT, parsed.value.details()
    good_call(stub)


def _requests_total(server: ServerProcess, model: str, outcome: str) -> float:
    with urllib.request.urlopen(f"{server.http_url}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    labels = (f'model="{model}"', 'transport="grpc"', f'outcome="{outcome}"')
    for line in text.splitlines():
        if line.startswith("ortserve_requests_total{") and all(label in line for label in labels):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_an_answer_over_the_message_limit_is_refused_and_counted_as_what_the_client_got(
    tmp_path: Path,
) -> None:
    # x [-1, 4] tiled to [-1, 64]: a request under the limit whose answer is 16x over it.
    repeats = numpy_helper.from_array(np.array([1, 16], np.int64), "repeats")
    graph = helper.make_graph(
        [helper.make_node("Tile", ["x", "repeats"], ["y"])],
        "widening",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])],
        [repeats],
    )
    folder = tmp_path / "models" / "widening" / "1"
    folder.mkdir(parents=True)
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
        str(folder / "model.onnx"),
    )
    args = ["--no-strict-readiness", "--grpc-max-message-bytes", "5000"]
    with run_server(tmp_path / "models", tmp_path / "server.log", args) as server:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_address))
        small = stub.ModelInfer(request("widening", np.ones((2, 4))), timeout=30)
        assert list(small.outputs[0].shape) == [2, 64]
        error = call_error(stub, request("widening", np.ones((30, 4))), timeout=30)  # 480 B in, 7.7 KB out
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
        assert "response larger than max" in error.details()
        assert _requests_total(server, "widening", "success") == 1
        assert _requests_total(server, "widening", "invalid") == 1  # not a success
