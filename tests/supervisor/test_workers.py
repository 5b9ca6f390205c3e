"""``--workers 2``: both ports shared, requests spread over the workers, one aggregated view of
metrics, statistics and model control, and a killed worker restarted while the server serves."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from model_builders import write_scaled_version
from ortserve.testing import ServerProcess, run_server
from workers_helpers import infer, matching, ready_status, scrape, value, wait_until, worker_pids

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("worker-models")
    write_scaled_version(root, "scaled", 1, 2.0)
    write_scaled_version(root, "later", 1, 3.0)
    args = ["--workers", "2", "--model-control-mode", "explicit", "--load-model", "scaled"]
    with run_server(root, tmp_path_factory.mktemp("logs") / "server.log", args) as server:
        wait_until(lambda: value(scrape(server), "ortserve_workers_ready") == 2, what="both workers ready")
        yield server


def _requests(server: ServerProcess) -> dict[str, float]:
    samples = scrape(server)
    return {
        transport: value(
            samples,
            "ortserve_requests_total",
            model="scaled",
            version="1",
            transport=transport,
            outcome="success",
        )
        for transport in ("http", "grpc")
    }


def test_requests_spread_over_workers_and_metrics_add_up(workers: ServerProcess) -> None:
    before = scrape(workers)
    for _ in range(40):
        assert infer(workers, "scaled")[0] == 200
    client = grpcclient.InferenceServerClient(workers.grpc_address)
    x = np.ones((1, 4), np.float32)
    inputs = [grpcclient.InferInput("x", [1, 4], "FP32")]
    inputs[0].set_data_from_numpy(x)
    for _ in range(5):
        np.testing.assert_allclose(client.infer("scaled", inputs).as_numpy("y"), x * 2.0)
    client.close()
    after = scrape(workers)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    per_worker = {
        dict(k)["worker"]: v - before.get(("ortserve_worker_requests_total", k), 0.0)
        for k, v in matching(after, "ortserve_worker_requests_total").items()
    }
    assert sorted(per_worker) == ["0", "1"]
    assert all(count > 0 for count in per_worker.values()), per_worker  # SO_REUSEPORT spreads
    assert sum(per_worker.values()) == 45
    labels = {"model": "scaled", "version": "1"}
    assert delta("ortserve_requests_total", **labels, transport="http", outcome="success") == 40
    assert delta("ortserve_requests_total", **labels, transport="grpc", outcome="success") == 5
    assert delta("ortserve_request_duration_seconds_count", **labels, transport="http") == 40
    assert delta("ortserve_request_duration_seconds_bucket", **labels, transport="http", le="+Inf") == 40
    buckets = sorted(
        (float(dict(k)["le"]), v)
        for k, v in matching(
            after, "ortserve_request_duration_seconds_bucket", **labels, transport="http"
        ).items()
    )
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)  # cumulative after merging

    stats = httpclient.InferenceServerClient(workers.http_address).get_inference_statistics("scaled")
    assert int(stats["model_stats"][0]["inference_count"]) == value(
        after, "ortserve_requests_total", **labels, transport="http", outcome="success"
    ) + value(after, "ortserve_requests_total", **labels, transport="grpc", outcome="success")


def test_model_control_reaches_every_worker(workers: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(workers.http_address)
    index = {row["name"]: row["state"] for row in client.get_model_repository_index()}
    assert index == {"scaled": "READY", "later": "UNAVAILABLE"}
    client.load_model("later")
    index = {row["name"]: row["state"] for row in client.get_model_repository_index()}
    assert index == {"scaled": "READY", "later": "READY"}
    assert all(infer(workers, "later") == (200, [3.0] * 4) for _ in range(20))  # on both workers


def test_grpc_statistics_and_model_control_see_every_worker(workers: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(workers.grpc_address)
    http = httpclient.InferenceServerClient(workers.http_address)
    assert all(infer(workers, "scaled")[0] == 200 for _ in range(10))
    over_grpc = client.get_inference_statistics("scaled", as_json=True)["model_stats"][0]
    over_http = http.get_inference_statistics("scaled")["model_stats"][0]
    assert int(over_grpc["inference_count"]) == int(over_http["inference_count"])
    client.unload_model("later")
    assert _states(http)["later"] == "UNAVAILABLE"
    assert all(infer(workers, "later")[0] != 200 for _ in range(10))  # gone from both workers
    client.load_model("later")
    index = {row["name"]: row["state"] for row in client.get_model_repository_index(as_json=True)["models"]}
    assert index == {"scaled": "READY", "later": "READY"}
    assert all(infer(workers, "later") == (200, [3.0] * 4) for _ in range(20))
    client.close()


def test_killed_worker_is_restarted_and_the_server_stays_ready(workers: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(workers.http_address)
    client.load_model("later")
    before = _states(client)
    assert before == {"scaled": "READY", "later": "READY"}
    pids = worker_pids(scrape(workers))
    os.kill(int(pids["0"]), signal.SIGKILL)
    # Connections already queued on the dying worker's listener are lost (SO_REUSEPORT gives
    # each listener its own queue); once the supervisor has seen it exit, it is gone from the
    # port, and its successor joins only when it has loaded what the others serve.
    wait_until(
        lambda: value(scrape(workers), "ortserve_worker_restarts_total", worker="0") == 1,
        what="the supervisor sees worker 0 die",
    )
    for _ in range(3):  # before, while and after its successor loads
        assert all(infer(workers, "later") == (200, [3.0] * 4) for _ in range(10))
        assert ready_status(workers) == 200

    def restarted() -> bool:
        samples = scrape(workers)
        return (
            worker_pids(samples).get("0") not in (None, pids["0"])
            and value(samples, "ortserve_workers_up") == 2
        )

    wait_until(restarted, what="worker 0 restarted")
    assert worker_pids(scrape(workers))["1"] == pids["1"]
    # The restarted worker was given the model loaded through the API before it died.
    wait_until(lambda: _states(client) == before, what="the index as before")
    assert all(infer(workers, "later") == (200, [3.0] * 4) for _ in range(20))
    assert "worker 0 (pid" in workers.log() and "restart 1" in workers.log()


def _states(client: httpclient.InferenceServerClient) -> dict[str, str]:
    return {row["name"]: row["state"] for row in client.get_model_repository_index()}
