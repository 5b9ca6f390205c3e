"""Readiness during shutdown: SIGTERM -> not ready at once, requests still served for
``--shutdown-delay``, then the drain, exit 0; with one process and with ``--workers 2``."""

from __future__ import annotations

import http.client
import json
import signal
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest

from model_builders import slow_model, write_scaled_version
from ortserve.testing import run_server
from workers_helpers import infer, ready_status, scrape, value, wait_until

pytestmark = pytest.mark.e2e

_SIZE = 512  # 48 products of 512x512: a fraction of a second per request on one core


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shutdown-models")
    write_scaled_version(root, "scaled", 1, 2.0)
    return root


@pytest.mark.parametrize("workers", ["1", "2"])
def test_sigterm_answers_not_ready_but_serves_during_the_delay_then_exits_zero(
    repository: Path, tmp_path: Path, workers: str
) -> None:
    args = ["--workers", workers, "--shutdown-delay", "30"]
    with run_server(repository, tmp_path / "server.log", args) as server:
        if workers == "2":
            wait_until(
                lambda: value(scrape(server), "ortserve_workers_ready") == 2, what="both workers ready"
            )
        assert ready_status(server) == 200
        server.process.send_signal(signal.SIGTERM)
        wait_until(lambda: ready_status(server) == 503, timeout_s=10, what="not ready")
        # Still accepting new connections and answering them, on every worker.
        assert all(ready_status(server) == 503 for _ in range(10))
        assert all(infer(server, "scaled") == (200, [2.0] * 4) for _ in range(10))
        assert server.process.poll() is None
        # A second signal ends the delay: drain, exit 0.
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) == 0
        log = server.log()
    assert "still accepting for 30.0 s" in log
    assert log.count("stopped") >= int(workers)


def _slow_request(host: str, port: int, results: list[int]) -> None:
    header = json.dumps(
        {"inputs": [{"name": "x", "shape": [1, _SIZE, _SIZE], "datatype": "FP32",
                     "parameters": {"binary_data_size": _SIZE * _SIZE * 4}}]}
    ).encode()  # fmt: skip
    body = header + np.full((1, _SIZE, _SIZE), 0.001, np.float32).tobytes()
    connection = http.client.HTTPConnection(host, port, timeout=120)
    headers = {"Inference-Header-Content-Length": str(len(header))}
    connection.request("POST", "/v2/models/slow/infer", body, headers)
    results.append(connection.getresponse().status)
    connection.close()


def test_sigterm_lets_every_worker_finish_its_requests(tmp_path: Path) -> None:
    root = tmp_path / "models"
    (root / "slow" / "1").mkdir(parents=True)
    model = slow_model(matmuls=48, size=_SIZE)
    model.ir_version = 9
    onnx.save(model, str(root / "slow" / "1" / "model.onnx"))
    # Queueing three slow requests per worker is the point here: no queue-wait admission.
    (root / "slow" / "config.yaml").write_text("batching:\n  max_batch_size: 0\n  max_queue_wait_ms: 0\n")
    # The delay lets the requests still connecting in; the grace lets them all finish.
    args = ["--workers", "2", "--intra-op-threads", "1", "--shutdown-delay", "1"]
    with run_server(root, tmp_path / "server.log", args) as server:
        wait_until(lambda: value(scrape(server), "ortserve_workers_ready") == 2, what="both workers ready")
        results: list[int] = []
        threads = [
            threading.Thread(target=_slow_request, args=(server.host, server.http_port, results))
            for _ in range(6)
        ]
        for thread in threads:
            thread.start()

        def inflight() -> float:
            return value(scrape(server), "ortserve_inflight_requests", transport="http")

        wait_until(lambda: inflight() >= 1, what="requests in flight")
        server.process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(120)
        assert server.process.wait(60) == 0
        assert results == [200] * 6
        log = server.log()
    assert "all workers stopped (exit codes [0, 0])" in log
