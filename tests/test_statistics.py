"""Triton statistics totals and the request telemetry that feeds them."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from ortserve.core.observer import BatchRecord
from ortserve.core.types import InferRequest
from ortserve.errors import InvalidInput, ModelNotFound
from ortserve.metrics import ServerMetrics
from ortserve.statistics import ServerStatistics, encode_statistics
from ortserve.telemetry import Telemetry


def test_requests_and_executions_are_counted_as_triton_counts_them() -> None:
    stats = ServerStatistics()
    version = stats.version("m", "1")
    version.on_batch(BatchRecord(2, 3, (0.001, 0.003), 0.0001, 0.002, 0.0002, False))
    version.on_batch(BatchRecord(1, 3, (0.0,), 0.0, 0.001, 0.0, False))
    version.on_batch(BatchRecord(1, 1, (0.0,), 0.0, 0.5, 0.0, True))  # failed: not an execution
    version.record_request(True, 0.004)
    version.record_request(False, 0.0001)
    (snapshot,) = stats.snapshot("m", "1")
    assert (snapshot.inference_count, snapshot.execution_count) == (6, 2)
    assert (snapshot.success.count, snapshot.success.ns) == (1, 4_000_000)
    assert (snapshot.fail.count, snapshot.fail.ns) == (1, 100_000)
    assert (snapshot.queue.count, snapshot.queue.ns) == (3, 4_000_000)
    assert (snapshot.compute_infer.count, snapshot.compute_infer.ns) == (3, 5_000_000)
    (size_three,) = snapshot.batch_stats
    assert size_three.batch_size == 3
    assert (size_three.compute_infer.count, size_three.compute_infer.ns) == (2, 3_000_000)


def test_snapshot_is_a_copy_that_later_traffic_does_not_change() -> None:
    stats = ServerStatistics()
    stats.version("m", "1").record_request(True, 0.001)
    (before,) = stats.snapshot()
    stats.version("m", "1").record_request(True, 0.001)
    assert before.success.count == 1


def test_json_has_tritons_shape_and_versions_sort_numerically() -> None:
    stats = ServerStatistics()
    for version in ("10", "2"):
        stats.version("m", version).on_batch(BatchRecord(1, 1, (0.0,), 0.0, 0.001, 0.0, False))
    stats.version("a", "1")
    body = orjson.loads(encode_statistics(stats.snapshot()))
    assert [(e["name"], e["version"]) for e in body["model_stats"]] == [("a", "1"), ("m", "2"), ("m", "10")]
    entry = body["model_stats"][1]
    assert set(entry["inference_stats"]) == {
        "success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss",
    }  # fmt: skip
    assert entry["batch_stats"][0]["batch_size"] == 1
    assert entry["batch_stats"][0]["compute_infer"] == {"count": 1, "ns": 1_000_000}


def test_unknown_model_or_version_has_no_statistics() -> None:
    stats = ServerStatistics()
    stats.version("m", "1")
    with pytest.raises(ModelNotFound):
        stats.snapshot("other")
    with pytest.raises(ModelNotFound):
        stats.snapshot("m", "2")
    assert [s.version for s in stats.snapshot("m")] == ["1"]


def request(request_id: str | None = None) -> InferRequest:
    return InferRequest("m", [], id=request_id)


def test_request_id_from_the_body_wins_over_the_header_and_is_echoed() -> None:
    telemetry = Telemetry(ServerStatistics())
    scope = telemetry.begin("http", "m", None, "from-header", None)
    scope.identify(request("from-body"))
    assert scope.echoed_id() == b"from-body"
    scope = telemetry.begin("http", "m", None, "from-header", None)
    body = request()
    scope.identify(body)
    assert body.id == "from-header"  # the OIP response carries it too


def test_unsafe_request_ids_are_not_echoed_as_headers() -> None:
    telemetry = Telemetry(ServerStatistics())
    for unsafe in ("a\r\nset-cookie: x", "é", "x" * 300):
        scope = telemetry.begin("http", "m", None, None, None)
        scope.identify(request(unsafe))
        assert scope.echoed_id() is None


def test_failures_count_against_the_named_or_latest_version_and_unknown_models_against_none() -> None:
    metrics = ServerMetrics(lambda: [], lambda: {})
    stats = ServerStatistics()
    telemetry = Telemetry(stats, metrics)
    telemetry.observer_for("m", "1")
    telemetry.observer_for("m", "3")
    telemetry.begin("http", "m", None, None, None).finish(InvalidInput("bad"), 400)
    telemetry.begin("http", "m", "1", None, None).finish(InvalidInput("bad"), 400)
    telemetry.begin("http", "nope", None, None, None).finish(ModelNotFound("nope"), 404)
    assert stats.version("m", "3").fail_count == 1
    assert stats.version("m", "1").fail_count == 1
    assert metrics.version("", "").requests[("http", "invalid")] == 1
    assert ("nope", "") not in stats.versions


async def test_inflight_counts_open_requests_and_forgets_cancelled_ones() -> None:
    telemetry = Telemetry(ServerStatistics())
    loop = asyncio.get_running_loop()
    done, abandoned = (
        telemetry.begin("http", "m", None, None, None),
        telemetry.begin("http", "m", None, None, None),
    )
    telemetry.begin("grpc", "m", None, None, None)
    abandoned.pending = loop.create_future()
    assert telemetry.inflight() == {"http": 2, "grpc": 1}
    done.finish(None, 200)
    abandoned.pending.cancel()
    assert telemetry.inflight() == {"http": 0, "grpc": 1}


def test_a_version_without_a_scheduler_gets_series_when_it_first_answers() -> None:
    stats = ServerStatistics()
    telemetry = Telemetry(stats)
    telemetry.begin("http", "pipeline", None, None, None).finish(InvalidInput("bad"), 400)
    assert stats.versions == {}  # a failure proves nothing about the name
    scope = telemetry.begin("http", "pipeline", None, None, None)
    scope.inferred("1")
    scope.finish(None, 200)
    assert stats.version("pipeline", "1").success_count == 1


def test_an_unloaded_version_leaves_no_series_behind_and_a_late_answer_does_not_revive_them() -> None:
    metrics = ServerMetrics(lambda: [], lambda: {})
    stats = ServerStatistics()
    telemetry = Telemetry(stats, metrics)
    telemetry.observer_for("m", "1")
    telemetry.observer_for("m", "2")
    late = telemetry.begin("http", "m", None, None, None)
    telemetry.forget("m", "2")
    assert set(stats.versions) == set(metrics.versions) == {("m", "1")}
    late.inferred("2")  # answered by version 2 while it drained, finished after it was released
    late.finish(None, 200)
    assert ("m", "2") not in stats.versions
    assert ("m", "2") not in metrics.versions
    telemetry.begin("http", "m", None, None, None).finish(InvalidInput("bad"), 400)
    assert stats.version("m", "1").fail_count == 1  # the model's newest is version 1 again
    telemetry.forget("m", "1")
    assert stats.versions == {}
    assert metrics.versions == {("", ""): metrics.versions[("", "")]}  # only the unattributed series
