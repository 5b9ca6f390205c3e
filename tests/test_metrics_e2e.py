"""After known traffic, the real server's metrics and statistics show exactly that traffic."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import tritonclient.http as triton_http
from prometheus_client.parser import text_string_to_metric_families

from ortserve.demo import write_demo_repository
from ortserve.testing import ServerProcess, run_server

pytestmark = pytest.mark.e2e

SMALL = {"model": "small_mlp", "version": "1"}
CONCURRENT = 16
ROW_SIZES = (1, 2, 4)


def infer_body(rows: int, width: int = 64, **parameters: object) -> bytes:
    body: dict[str, object] = {
        "inputs": [
            {"name": "input", "datatype": "FP32", "shape": [rows, width], "data": [0.5] * (rows * width)}
        ]
    }
    if parameters:
        body["parameters"] = parameters
    return json.dumps(body).encode()


def post(url: str, body: bytes) -> int:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        error.close()
        return int(error.code)


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return bytes(reply.read())


def get_status(url: str) -> int:
    try:
        get(url)
    except urllib.error.HTTPError as error:
        error.close()
        return int(error.code)
    return 200


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(get(url).decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return (name, tuple(sorted(labels.items())))


@pytest.fixture(scope="module")
def traffic_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server of its own that received exactly the traffic below."""
    root = tmp_path_factory.mktemp("metrics-models")
    write_demo_repository(root)
    with run_server(root, tmp_path_factory.mktemp("metrics-logs") / "server.log") as server:
        infer = f"{server.http_url}/v2/models/small_mlp/infer"
        for rows in ROW_SIZES:
            assert post(infer, infer_body(rows)) == 200
        assert post(infer, infer_body(1, width=3)) == 400
        assert (
            post(infer, infer_body(1, timeout=1)) == 504
        )  # 1 µs: refused at admission, unmeetable (outcome "deadline")
        assert post(f"{server.http_url}/v2/models/small_mlp/versions/9/infer", infer_body(1)) == 404
        with ThreadPoolExecutor(CONCURRENT) as pool:
            statuses = list(pool.map(lambda _: post(infer, infer_body(1)), range(CONCURRENT)))
        assert statuses == [200] * CONCURRENT
        yield server


def metrics_url(server: ServerProcess) -> str:
    return f"http://{server.host}:{server.metrics_port}/metrics"


def test_request_counters_show_each_outcome_exactly(traffic_server: ServerProcess) -> None:
    found = scrape(metrics_url(traffic_server))
    successes = len(ROW_SIZES) + CONCURRENT
    expected = {"success": successes, "invalid": 1, "overloaded": 0, "deadline": 1, "internal": 0}
    for outcome, count in expected.items():
        assert found[key("ortserve_requests_total", transport="http", outcome=outcome, **SMALL)] == count
    unknown = key("ortserve_requests_total", model="", version="", transport="http", outcome="invalid")
    assert found[unknown] == 1  # an unknown version never becomes a label of its own
    assert found[key("ortserve_scheduler_rejections_total", reason="deadline", **SMALL)] == 1


def test_latency_histogram_buckets_add_up(traffic_server: ServerProcess) -> None:
    found = scrape(metrics_url(traffic_server))
    labels = {"transport": "http", **SMALL}
    buckets = sorted(
        (float(dict(lbl)["le"]), v)
        for (name, lbl), v in found.items()
        if name == "ortserve_request_duration_seconds_bucket" and dict(lbl).items() >= labels.items()
    )
    counts = [count for _, count in buckets]
    assert counts == sorted(counts)  # cumulative
    assert buckets[-1] == (float("inf"), len(ROW_SIZES) + CONCURRENT + 2)
    assert found[key("ortserve_request_duration_seconds_count", **labels)] == counts[-1]
    mean = found[key("ortserve_request_duration_seconds_sum", **labels)] / counts[-1]
    assert 1e-5 < mean < 5.0


def test_batch_series_account_for_every_request_and_row(traffic_server: ServerProcess) -> None:
    found = scrape(metrics_url(traffic_server))
    successes = len(ROW_SIZES) + CONCURRENT
    executions = found[key("ortserve_batch_requests_count", **SMALL)]
    assert found[key("ortserve_batch_requests_sum", **SMALL)] == successes
    assert found[key("ortserve_batch_rows_sum", **SMALL)] == sum(ROW_SIZES) + CONCURRENT
    assert 1 <= executions <= successes
    assert found[key("ortserve_queue_wait_seconds_count", **SMALL)] == successes
    for phase in ("input", "infer", "output"):
        assert found[key("ortserve_compute_seconds_count", phase=phase, **SMALL)] == executions
    mean_run = found[key("ortserve_compute_seconds_sum", phase="infer", **SMALL)] / executions
    assert 0 < mean_run < 1.0


def test_state_gauges_describe_the_loaded_models(traffic_server: ServerProcess) -> None:
    found = scrape(metrics_url(traffic_server))
    assert found[key("ortserve_model_state", state="ready", **SMALL)] == 1
    assert found[key("ortserve_model_state", state="failed", **SMALL)] == 0
    assert found[key("ortserve_model_execution_provider", provider="CPUExecutionProvider", **SMALL)] == 1
    assert found[key("ortserve_queue_depth", **SMALL)] == 0
    assert found[key("ortserve_inflight_requests", transport="http")] == 0
    assert found[key("ortserve_model_load_duration_seconds", **SMALL)] > 0


def test_http_port_serves_the_same_metrics(traffic_server: ServerProcess) -> None:
    found = scrape(f"{traffic_server.http_url}/metrics")
    assert found[key("ortserve_requests_total", transport="http", outcome="invalid", **SMALL)] == 1


def test_metrics_port_answers_only_metrics(traffic_server: ServerProcess) -> None:
    assert get_status(f"http://{traffic_server.host}:{traffic_server.metrics_port}/v2") == 404


def test_statistics_extension_counts_requests_and_executions(traffic_server: ServerProcess) -> None:
    stats = json.loads(get(f"{traffic_server.http_url}/v2/models/small_mlp/versions/1/stats"))
    (entry,) = stats["model_stats"]
    inference = entry["inference_stats"]
    successes = len(ROW_SIZES) + CONCURRENT
    assert (entry["name"], entry["version"]) == ("small_mlp", "1")
    assert inference["success"]["count"] == successes
    assert inference["fail"]["count"] == 2  # the bad shape and the refused request
    assert entry["inference_count"] == sum(ROW_SIZES) + CONCURRENT
    assert inference["queue"]["count"] == successes
    assert inference["compute_infer"]["count"] == successes
    assert sum(b["compute_infer"]["count"] for b in entry["batch_stats"]) == entry["execution_count"]
    assert {4, 2} <= {b["batch_size"] for b in entry["batch_stats"]}
    assert 1e4 < inference["success"]["ns"] / successes < 5e9
    assert entry["last_inference"] > 0


def test_statistics_of_all_models_and_of_unknown_models(traffic_server: ServerProcess) -> None:
    every = json.loads(get(f"{traffic_server.http_url}/v2/models/stats"))["model_stats"]
    assert {"small_mlp", "heavy_mlp"} <= {entry["name"] for entry in every}
    assert get_status(f"{traffic_server.http_url}/v2/models/nope/stats") == 404


def test_tritonclient_reads_the_statistics_and_the_extension_is_listed(traffic_server: ServerProcess) -> None:
    client = triton_http.InferenceServerClient(traffic_server.http_address)
    try:
        stats = client.get_inference_statistics("small_mlp")
        assert "statistics" in client.get_server_metadata()["extensions"]
    finally:
        client.close()
    assert stats["model_stats"][0]["inference_stats"]["success"]["count"] == len(ROW_SIZES) + CONCURRENT


def test_metrics_off_serves_no_metrics_and_keeps_statistics(tmp_path: Path) -> None:
    root = tmp_path / "models"
    write_demo_repository(root)
    with run_server(root, tmp_path / "server.log", ["--no-metrics", "--grpc-port", "-1"]) as server:
        assert post(f"{server.http_url}/v2/models/small_mlp/infer", infer_body(1)) == 200
        assert get_status(f"{server.http_url}/metrics") == 404
        with pytest.raises(urllib.error.URLError):
            get(metrics_url(server))  # no listener on the metrics port
        stats = json.loads(get(f"{server.http_url}/v2/models/small_mlp/stats"))
    assert stats["model_stats"][0]["inference_stats"]["success"]["count"] == 1


def test_process_gc_and_build_info_families_are_exported(traffic_server: ServerProcess) -> None:
    from ortserve import __version__

    found = scrape(metrics_url(traffic_server))
    assert found[key("process_resident_memory_bytes")] > 10 * 1024 * 1024
    assert found[key("process_cpu_seconds_total")] > 0
    assert found[key("process_open_fds")] > 3
    assert found[key("python_gc_collections_total", generation="0")] >= 0
    (build,) = [labels for name, labels in found if name == "ortserve_build_info"]
    assert dict(build)["version"] == __version__ and found[("ortserve_build_info", build)] == 1


def test_openmetrics_is_served_to_scrapers_that_ask_for_it(traffic_server: ServerProcess) -> None:
    import urllib.request

    from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

    for url in (metrics_url(traffic_server), f"{traffic_server.http_url}/metrics"):
        accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
        request = urllib.request.Request(url, headers={"Accept": accept})
        with urllib.request.urlopen(request, timeout=30) as reply:
            assert reply.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
            text = reply.read().decode()
        assert text.endswith("# EOF\n")
        names = {family.name for family in openmetrics_families(text)}  # type: ignore[no-untyped-call]
        assert {"ortserve_requests", "process_cpu_seconds", "ortserve_build_info"} <= names
    with urllib.request.urlopen(metrics_url(traffic_server), timeout=30) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain; version=")
