"""Prometheus metrics: buckets, outcomes, per-batch series fed by a real scheduler, exposition."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fake_executor import FakeExecutor
from ortserve.core.observer import BatchRecord
from ortserve.core.policy import SchedulingPolicy
from ortserve.core.scheduler import Scheduler
from ortserve.errors import (
    DeadlineExceeded,
    InferenceError,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    NotImplementedByServer,
    OrtServeError,
    Overloaded,
    PayloadTooLarge,
)
from ortserve.metrics import Histogram, ServerMetrics, VersionState, outcome_of, parse_buckets
from ortserve.statistics import ServerStatistics
from ortserve.telemetry import Telemetry
from ortserve.testing import FakeClock

Feeds = dict[str, np.ndarray]
Labels = dict[str, str]


def samples(exposition: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text exposition, keyed by name and sorted labels."""
    found = {}
    for family in text_string_to_metric_families(exposition.decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(exposition: bytes, name: str, **labels: str) -> float:
    return samples(exposition)[(name, tuple(sorted(labels.items())))]


def idle_metrics(buckets: tuple[float, ...] = (0.001, 0.01, 0.1)) -> ServerMetrics:
    return ServerMetrics(lambda: [], lambda: {"http": 0, "grpc": 0}, buckets)


def rows(n: int) -> Feeds:
    return {"x": np.zeros((n, 2), dtype=np.float32)}


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (None, "success"),
        (InvalidInput("x"), "invalid"),
        (PayloadTooLarge("x"), "invalid"),
        (ModelNotFound("x"), "invalid"),
        (Overloaded("x", retry_after_s=1.0), "overloaded"),
        (DeadlineExceeded("x"), "deadline"),
        (ModelNotReady("x"), "unavailable"),
        (InferenceError("x"), "internal"),
        (NotImplementedByServer("x"), "internal"),
        (OrtServeError("x"), "internal"),
    ],
)
def test_each_error_class_maps_to_one_outcome(error: OrtServeError | None, outcome: str) -> None:
    assert outcome_of(error) == outcome


def test_histogram_puts_values_on_bucket_bounds_in_that_bucket_and_cumulates() -> None:
    histogram = Histogram((0.001, 0.01))
    for seconds in (0.0005, 0.001, 0.002, 0.01, 5.0):
        histogram.observe(seconds)
    assert histogram.cumulative() == [("0.001", 2), ("0.01", 4), ("+Inf", 5)]
    assert histogram.count == 5
    assert histogram.sum == pytest.approx(5.0135)


def test_bucket_list_must_be_positive_and_increasing() -> None:
    assert parse_buckets("0.001, 0.01,1") == (0.001, 0.01, 1.0)
    for bad in ("", "0,1", "0.1,0.1", "1,0.5", "fast"):
        with pytest.raises(ValueError):
            parse_buckets(bad)


def test_request_outcomes_and_latency_are_exported_per_version_and_transport() -> None:
    metrics = idle_metrics()
    series = metrics.version("m", "1")
    series.record_request("http", "success", 0.0005)
    series.record_request("http", "success", 0.02)
    series.record_request("grpc", "overloaded", 0.0001)
    text = metrics.exposition()
    assert (
        value(text, "ortserve_requests_total", model="m", version="1", transport="http", outcome="success")
        == 2
    )
    assert (
        value(text, "ortserve_requests_total", model="m", version="1", transport="grpc", outcome="overloaded")
        == 1
    )
    assert (
        value(text, "ortserve_requests_total", model="m", version="1", transport="http", outcome="deadline")
        == 0
    )
    latency = {"model": "m", "version": "1", "transport": "http"}
    assert value(text, "ortserve_request_duration_seconds_bucket", le="0.001", **latency) == 1
    assert value(text, "ortserve_request_duration_seconds_bucket", le="0.1", **latency) == 2
    assert value(text, "ortserve_request_duration_seconds_count", **latency) == 2
    assert value(text, "ortserve_request_duration_seconds_sum", **latency) == pytest.approx(0.0205)


def test_batches_feed_queue_compute_and_batch_size_histograms() -> None:
    metrics = idle_metrics()
    series = metrics.version("m", "1")
    series.on_batch(BatchRecord(3, 5, (0.0001, 0.002, 0.02), 0.00001, 0.004, 0.00002, False))
    series.on_batch(BatchRecord(1, 1, (0.5,), 0.0, 0.0, 0.0, True))
    text = metrics.exposition()
    m = {"model": "m", "version": "1"}
    assert value(text, "ortserve_queue_wait_seconds_count", **m) == 3
    assert value(text, "ortserve_queue_wait_seconds_bucket", le="0.001", **m) == 1
    assert value(text, "ortserve_queue_wait_seconds_bucket", le="0.01", **m) == 2
    assert value(text, "ortserve_compute_seconds_sum", phase="infer", **m) == pytest.approx(0.004)
    assert value(text, "ortserve_compute_seconds_count", phase="input", **m) == 1
    assert value(text, "ortserve_batch_rows_bucket", le="4.0", **m) == 0
    assert value(text, "ortserve_batch_rows_bucket", le="8.0", **m) == 1
    assert value(text, "ortserve_batch_requests_sum", **m) == 3
    assert value(text, "ortserve_batch_failures_total", **m) == 1


def test_scrape_time_gauges_come_from_the_state_callbacks() -> None:
    state = VersionState("m", "2", "ready", "CPUExecutionProvider", 7, 1, 0.25)
    metrics = ServerMetrics(lambda: [state], lambda: {"http": 3, "grpc": 0})
    text = metrics.exposition()
    m = {"model": "m", "version": "2"}
    assert value(text, "ortserve_queue_depth", **m) == 7
    assert value(text, "ortserve_busy_instances", **m) == 1
    assert value(text, "ortserve_model_state", state="ready", **m) == 1
    assert value(text, "ortserve_model_state", state="loading", **m) == 0
    assert value(text, "ortserve_model_execution_provider", provider="CPUExecutionProvider", **m) == 1
    assert value(text, "ortserve_model_load_duration_seconds", **m) == 0.25
    assert value(text, "ortserve_inflight_requests", transport="http") == 3


def test_two_servers_metrics_do_not_share_series() -> None:
    first, second = idle_metrics(), idle_metrics()
    first.version("m", "1").record_request("http", "success", 0.001)
    second.version("m", "1")
    labels = {"model": "m", "version": "1", "transport": "http", "outcome": "success"}
    assert value(first.exposition(), "ortserve_requests_total", **labels) == 1
    assert value(second.exposition(), "ortserve_requests_total", **labels) == 0


async def test_a_real_scheduler_reports_batches_rejections_and_expiries() -> None:
    loop = asyncio.get_running_loop()
    metrics = idle_metrics()
    telemetry = Telemetry(ServerStatistics(), metrics)
    executor, clock = FakeExecutor(), FakeClock()
    policy = SchedulingPolicy(max_batch_size=8, max_queue_size=3)
    scheduler = Scheduler(executor, policy, clock, loop, observer=telemetry.observer_for("m", "1"))
    first = scheduler.submit(rows(1), 1)  # runs at the end of the loop's tick
    for _ in range(3):
        await asyncio.sleep(0)
    batched = [scheduler.submit(rows(2), 2), scheduler.submit(rows(3), 3)]
    expiring = scheduler.submit(rows(1), 1, timeout_s=0.005)
    with pytest.raises(Overloaded):
        scheduler.submit(rows(1), 1)  # the queue holds 3 already
    clock.advance(0.01)
    with pytest.raises(DeadlineExceeded):
        await expiring
    executor.finish(seconds=0.002)
    await first
    for _ in range(3):
        await asyncio.sleep(0)
    executor.finish(seconds=0.003)  # the two queued requests ran as one batch of 5 rows
    await asyncio.gather(*batched)
    text = metrics.exposition()
    m = {"model": "m", "version": "1"}
    assert value(text, "ortserve_scheduler_rejections_total", reason="overloaded", **m) == 1
    assert value(text, "ortserve_scheduler_rejections_total", reason="deadline", **m) == 1
    assert value(text, "ortserve_batch_requests_count", **m) == 2
    assert value(text, "ortserve_batch_requests_sum", **m) == 3
    assert value(text, "ortserve_batch_rows_sum", **m) == 6
    assert value(text, "ortserve_queue_wait_seconds_count", **m) == 3
    assert value(text, "ortserve_compute_seconds_sum", phase="infer", **m) == pytest.approx(0.005)


def test_cli_refuses_bucket_lists_that_are_not_increasing(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from ortserve.cli.main import main

    result = CliRunner().invoke(
        main, ["serve", "--model-repository", str(tmp_path), "--metrics-buckets", "0.1,0.01"]
    )
    assert result.exit_code == 2
    assert "strictly increasing" in result.output
