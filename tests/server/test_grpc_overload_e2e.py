"""A few hundred concurrent gRPC calls on a model whose queue holds far fewer (issue 30, item 4):
every call the real server ends is the model's correct output or RESOURCE_EXHAUSTED with a
``retry-after`` of at least a second, over HTTP/2 connections carrying 100 streams each; none
is lost, none is another status, and the connections stay usable."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ortserve.demo import build_mlp
from ortserve.testing import ServerProcess, run_server

pytestmark = pytest.mark.e2e

CONNECTIONS = 3
CALLS = 300  # at once, 100 streams per connection
ROUNDS = 3
WIDTH = 64
CONFIG = """\
batching:
  max_batch_size: 4
  max_queue_delay_ms: 1.0
  max_queue_size: 8
"""


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("grpc_overload_models")
    version = root / "crowded" / "1"
    version.mkdir(parents=True)
    onnx.save(build_mlp([WIDTH, 128, 8], 7, "crowded"), str(version / "model.onnx"))
    (root / "crowded" / "config.yaml").write_text(CONFIG, encoding="utf-8")
    return version / "model.onnx"


@pytest.fixture(scope="module")
def crowded(model_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("grpc_overload_logs") / "server.log"
    with run_server(model_file.parent.parent.parent, log, ["--intra-op-threads", "1"]) as server:
        yield server


def infer_request(rows: np.ndarray, index: int) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="crowded", id=str(index))
    request.inputs.add(name="input", datatype="FP32", shape=list(rows.shape))
    request.raw_input_contents.append(rows.astype(np.float32).tobytes())
    return request


def test_every_call_of_a_crowd_is_correct_or_resource_exhausted_with_retry_after(
    crowded: ServerProcess, model_file: Path
) -> None:
    rng = np.random.default_rng(5)
    inputs = rng.standard_normal((CALLS * ROUNDS, WIDTH)).astype(np.float32)
    session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"input": inputs})[0]
    # Separate channels are separate HTTP/2 connections (a channel argument keeps them apart).
    channels = [
        grpc.insecure_channel(crowded.grpc_address, options=[("grpc.channel_pool_index", n)])
        for n in range(CONNECTIONS)
    ]
    stubs = [service_pb2_grpc.GRPCInferenceServiceStub(channel) for channel in channels]
    served = refused = 0
    try:
        for round_ in range(ROUNDS):
            calls = []
            for n in range(CALLS):
                index = round_ * CALLS + n
                stub = stubs[n % CONNECTIONS]
                calls.append(
                    (
                        index,
                        stub.ModelInfer.future(infer_request(inputs[index : index + 1], index), timeout=60),
                    )
                )
            for index, call in calls:
                try:
                    answer = call.result()
                except grpc.RpcError as error:
                    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (error.code(), error.details())
                    trailing = dict(error.trailing_metadata() or ())
                    assert int(trailing["retry-after"]) >= 1, trailing
                    refused += 1
                    continue
                assert answer.id == str(index)
                got = np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(1, -1)
                np.testing.assert_allclose(got, expected[index : index + 1], rtol=1e-4, atol=1e-5)
                served += 1
        assert served + refused == CALLS * ROUNDS  # every call ended, on its connection
        assert served > 0
        assert refused > 0  # 300 calls at once against a queue of 8: the crowd was refused in part
        for stub in stubs:  # the connections still serve
            stub.ModelInfer(infer_request(inputs[:1], 0), timeout=60)
    finally:
        for channel in channels:
            channel.close()
