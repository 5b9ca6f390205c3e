"""Merging the workers' views: histograms, counters, gauges, statistics and repository index."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ortserve.metrics import ServerMetrics, VersionState
from ortserve.supervisor.aggregate import merge_expositions, merge_index, merge_statistics, worker_requests
from ortserve.supervisor.gateway import _Families

_READY = VersionState("m", "1", "ready", "CPUExecutionProvider", 2, 1, 0.5)
_LOADING = VersionState("m", "1", "loading", "", 0, 0, None)


def _worker(latencies: list[float], state: VersionState, inflight: int) -> ServerMetrics:
    metrics = ServerMetrics(lambda: [state], lambda: {"http": inflight})
    series = metrics.version("m", "1")
    for seconds in latencies:
        series.record_request("http", "success", seconds)
    return metrics


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("ortserve_")
    }


def _merged(*workers: ServerMetrics) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(merge_expositions([w.exposition().decode() for w in workers])))
    return generate_latest(registry).decode()


def test_histograms_and_counters_merge_to_what_one_process_would_have_counted() -> None:
    rng = random.Random(7)
    first = [rng.expovariate(1000.0) for _ in range(500)]
    second = [rng.expovariate(100.0) for _ in range(300)]
    merged = _samples(_merged(_worker(first, _READY, 1), _worker(second, _READY, 2)))
    alone = _samples(_worker(first + second, _READY, 3).exposition().decode())
    for key, expected in alone.items():
        name = key[0]
        counted = ("ortserve_request_duration_seconds", "ortserve_requests", "ortserve_inflight")
        if name.startswith(counted) and not name.endswith("_sum"):  # sums: float order, below
            assert merged[key] == expected, key
    latency = "ortserve_request_duration_seconds_sum"
    key = (latency, frozenset({"model": "m", "version": "1", "transport": "http"}.items()))
    assert abs(merged[key] - sum(first + second)) < 1e-9


def test_a_version_is_ready_only_when_every_worker_has_it_ready() -> None:
    both = _samples(_merged(_worker([], _READY, 0), _worker([], _READY, 0)))
    one = _samples(_merged(_worker([], _READY, 0), _worker([], _LOADING, 0)))
    ready = ("ortserve_model_state", frozenset({"model": "m", "version": "1", "state": "ready"}.items()))
    loading = ("ortserve_model_state", frozenset({"model": "m", "version": "1", "state": "loading"}.items()))
    assert (both[ready], both[loading]) == (1.0, 0.0)
    assert (one[ready], one[loading]) == (0.0, 1.0)
    depth = ("ortserve_queue_depth", frozenset({"model": "m", "version": "1"}.items()))
    assert both[depth] == 4.0  # gauges that count add up


def test_worker_requests_counts_every_outcome() -> None:
    metrics = _worker([0.001] * 3, _READY, 0)
    metrics.version("m", "1").record_request("grpc", "invalid", 0.001)
    assert worker_requests(metrics.exposition().decode()) == 4


def test_statistics_add_up_per_version_and_batch_size() -> None:
    def stats(count: int, last: int, sizes: list[int]) -> dict[str, object]:
        return {
            "model_stats": [
                {
                    "name": "m",
                    "version": "1",
                    "last_inference": last,
                    "inference_count": count,
                    "execution_count": count,
                    "inference_stats": {"success": {"count": count, "ns": 10 * count}},
                    "batch_stats": [{"batch_size": s, "compute_infer": {"count": 1, "ns": 5}} for s in sizes],
                }
            ]
        }

    merged = merge_statistics([stats(3, 100, [1, 2]), stats(4, 50, [2, 8])])["model_stats"][0]
    assert merged["inference_count"] == 7 and merged["last_inference"] == 100
    assert merged["inference_stats"]["success"] == {"count": 7, "ns": 70}
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in merged["batch_stats"]] == [
        (1, 1),
        (2, 2),
        (8, 1),
    ]


def test_index_reports_ready_only_where_every_worker_is_ready() -> None:
    first = [{"name": "a", "version": "1", "state": "READY", "reason": ""}]
    second = [
        {"name": "a", "version": "1", "state": "LOADING", "reason": ""},
        {"name": "b", "version": "1", "state": "READY", "reason": ""},
    ]
    rows = merge_index([first, second], ready_only=False)
    assert [(r["name"], r["state"]) for r in rows] == [("a", "LOADING"), ("b", "UNAVAILABLE")]
    assert rows[0]["reason"] == "ready on 1 of 2 workers"
    assert merge_index([first, first], ready_only=True) == [
        {"name": "a", "version": "1", "state": "READY", "reason": ""}
    ]
