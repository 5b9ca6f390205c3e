"""gRPC calls are captured in HTTP form, so a capture replays over HTTP with the same tensors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from ortserve.capture_records import read_capture
from ortserve.protocol.http_codec import decode_infer_request
from ortserve.protocol.tensors import TensorLimits
from ortserve.testing import run_server

pytestmark = pytest.mark.e2e


def test_grpc_infer_calls_are_captured_and_replay_over_http(demo_repository: Path, tmp_path: Path) -> None:
    capture_dir = tmp_path / "capture"
    args = ["--capture-dir", str(capture_dir), "--capture-rate", "1.0"]
    sent = [np.full((1, 64), float(i), dtype=np.float32) for i in range(3)]
    answers = []
    with run_server(demo_repository, tmp_path / "server.log", args) as server:
        client = grpcclient.InferenceServerClient(server.grpc_address)
        for index, data in enumerate(sent):
            tensor = grpcclient.InferInput("input", [1, 64], "FP32")
            tensor.set_data_from_numpy(data)
            result = client.infer("small_mlp", [tensor], request_id=f"g{index}", priority=1)
            answers.append(result.as_numpy("output"))
        wrong = grpcclient.InferInput("input", [1, 63], "FP32")
        wrong.set_data_from_numpy(np.zeros((1, 63), np.float32))
        with pytest.raises(InferenceServerException):
            client.infer("small_mlp", [wrong])
    records = list(read_capture([capture_dir]))
    assert [r.status for r in records] == [200, 200, 200, 400]
    for index, (record, data) in enumerate(zip(records, sent)):
        assert record.path == "/v2/models/small_mlp/infer"
        headers = dict(record.headers)
        decoded = decode_infer_request(
            record.body, int(headers["inference-header-content-length"]), "small_mlp", None, TensorLimits()
        )
        assert decoded.id == f"g{index}" and decoded.priority == 1
        np.testing.assert_array_equal(decoded.inputs[0].data, data)
    # The captured body is a valid HTTP request that gives the same answer.
    with run_server(demo_repository, tmp_path / "replay.log") as server:
        http = httpclient.InferenceServerClient(server.http_address)
        header_length = int(dict(records[2].headers)["inference-header-content-length"])
        result = http.infer("small_mlp", [_binary_input(records[2].body, header_length)])
        np.testing.assert_allclose(result.as_numpy("output"), answers[2], rtol=1e-6)


def _binary_input(body: bytes, header_length: int) -> httpclient.InferInput:
    tensor = httpclient.InferInput("input", [1, 64], "FP32")
    tensor.set_data_from_numpy(
        np.frombuffer(body[header_length:], np.float32).reshape(1, 64), binary_data=True
    )
    return tensor
