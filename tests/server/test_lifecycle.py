"""Process lifecycle: environment settings, startup log, and draining on SIGTERM."""

from __future__ import annotations

import http.client
import json
import signal
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import pytest

from model_builders import slow_model
from ortserve.testing import free_port, run_server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def slow_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("slow-models")
    model = slow_model(matmuls=48)
    model.ir_version = 9
    version = root / "slow" / "1"
    version.mkdir(parents=True)
    onnx.save(model, str(version / "model.onnx"))
    (root / "slow" / "config.yaml").write_text("batching:\n  max_batch_size: 0\n")
    return root


def slow_request(host: str, port: int, results: list[int], sent: threading.Event) -> None:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [1, 256, 256],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 256 * 256 * 4},
                }
            ]
        }
    ).encode()
    body = header + np.full((1, 256, 256), 0.001, np.float32).tobytes()
    connection = http.client.HTTPConnection(host, port, timeout=60)
    connection.request(
        "POST", "/v2/models/slow/infer", body, {"Inference-Header-Content-Length": str(len(header))}
    )
    sent.set()
    results.append(connection.getresponse().status)
    connection.close()


def test_sigterm_lets_in_flight_requests_finish_and_exits_zero(slow_repository: Path, tmp_path: Path) -> None:
    with run_server(slow_repository, tmp_path / "server.log", ["--intra-op-threads", "1"]) as server:
        results: list[int] = []
        sent = [threading.Event() for _ in range(3)]
        threads = [
            threading.Thread(target=slow_request, args=(server.host, server.http_port, results, e))
            for e in sent
        ]
        for thread in threads:
            thread.start()
        assert all(event.wait(10) for event in sent)
        assert _wait_for_inflight(server.http_url, 3, 20.0)
        server.process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(60)
        assert server.process.wait(60) == 0
        assert results == [200, 200, 200]
        log = server.log()
        assert "shutting down" in log and "stopped" in log


def _wait_for_inflight(url: str, count: int, seconds: float) -> bool:
    """Poll the in-flight gauge until ``count`` HTTP requests are inside the server."""
    wanted = f'ortserve_inflight_requests{{transport="http"}} {float(count)}'
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as reply:
            if wanted in reply.read().decode():
                return True
    return False


def test_settings_come_from_environment_and_the_startup_log_says_what_runs(
    slow_repository: Path, tmp_path: Path
) -> None:
    port = free_port()
    env = {"ORTSERVE_INTRA_OP_THREADS": "1", "ORTSERVE_LOG_LEVEL": "DEBUG"}
    with run_server(slow_repository, tmp_path / "server.log", env=env) as server:
        log = server.log()
    assert "intra-op threads 1" in log
    assert "CPUExecutionProvider" in log
    assert f"http://127.0.0.1:{server.http_port}" in log
    assert port > 0
