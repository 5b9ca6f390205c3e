"""Connection and intake metrics, read from the shared limit and governor at scrape time.

Nothing here runs per request or per connection: the limit and the governor keep plain
counters, and this collector turns them into families when Prometheus scrapes.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ortserve.server.connections import ConnectionLimit
from ortserve.server.http.run_queue import run_queues
from ortserve.server.intake import IntakeGovernor
from ortserve.server.read_lag import read_lags

__all__ = ["IntakeMetrics"]


class IntakeMetrics(Collector):
    """Exports the connection cap's counts and the intake governor's state."""

    def __init__(self, limit: ConnectionLimit, intake: IntakeGovernor) -> None:
        self._limit = limit
        self._intake = intake

    def collect(self) -> Iterator[Metric]:
        limit, intake = self._limit, self._intake
        yield GaugeMetricFamily(
            "ortserve_connections_open", "Client connections open (HTTP and gRPC)", limit.open
        )
        yield CounterMetricFamily(
            "ortserve_connections_refused", "Connections refused at the --max-connections cap", limit.refused
        )
        yield CounterMetricFamily(
            "ortserve_connections_evicted",
            "Idle connections closed to make room for new ones at the cap",
            limit.evicted,
        )
        yield GaugeMetricFamily(
            "ortserve_event_loop_lag_seconds", "Lateness of the intake governor's last timer", intake.lag_s
        )
        yield GaugeMetricFamily(
            "ortserve_intake_saturated", "1 while the loop lags past --intake-lag-ms", int(intake.saturated)
        )
        yield GaugeMetricFamily(
            "ortserve_intake_parked_connections",
            "Connections not being read now (back-pressure)",
            intake.parked,
        )
        yield CounterMetricFamily(
            "ortserve_intake_saturations", "Times the loop became saturated", intake.episodes
        )
        yield CounterMetricFamily(
            "ortserve_intake_parks", "Connections parked because the loop was saturated", intake.parked_total
        )
        yield from _read_lag_families()
        yield from _run_queue_families()


def _read_lag_families() -> Iterator[Metric]:
    """Where an overloaded loop's time goes (:mod:`ortserve.server.read_lag`)."""
    lags = read_lags()
    yield CounterMetricFamily(
        "ortserve_loop_request_heads",
        "Request heads read (HTTP) and infer messages peeked (gRPC)",
        sum(lag.reads for lag in lags),
    )
    yield CounterMetricFamily(
        "ortserve_loop_lag_samples",
        "Loop-lag samples taken while requests arrive",
        sum(lag.samples for lag in lags),
    )
    yield CounterMetricFamily(
        "ortserve_loop_lag_seconds",
        "Lateness of the samples (the estimated unread wait of a request), summed",
        sum(lag.lag_total_s for lag in lags),
    )
    yield GaugeMetricFamily(
        "ortserve_loop_lag_max_seconds",
        "Longest sampled lag since the last scrape",
        max((lag.take_max() for lag in lags), default=0.0),
    )


def _run_queue_families() -> Iterator[Metric]:
    """What the loop's HTTP iterations do (:mod:`ortserve.server.http.run_queue`)."""
    queues = run_queues()
    maxima = [queue.take_max() for queue in queues]
    yield CounterMetricFamily(
        "ortserve_loop_deferred_requests",
        "Admitted HTTP requests run after their iteration's reads",
        sum(queue.ran for queue in queues),
    )
    yield CounterMetricFamily(
        "ortserve_loop_turns",
        "Loop iterations that ran deferred requests",
        sum(queue.turns for queue in queues),
    )
    yield CounterMetricFamily(
        "ortserve_loop_turns_over_budget",
        "Turns that reached the per-iteration budget and left requests for the next iteration",
        sum(queue.carried for queue in queues),
    )
    yield GaugeMetricFamily(
        "ortserve_loop_turn_max_seconds",
        "Longest turn of deferred requests since the last scrape",
        max((turn for turn, _ in maxima), default=0.0),
    )
    yield CounterMetricFamily(
        "ortserve_loop_accepts", "HTTP connections accepted", sum(queue.accepts for queue in queues)
    )
    yield GaugeMetricFamily(
        "ortserve_loop_accept_burst_max",
        "Most HTTP connections accepted in one loop iteration since the last scrape",
        max((burst for _, burst in maxima), default=0),
    )
    yield CounterMetricFamily(
        "ortserve_loop_write_pauses",
        "Times an HTTP connection paused writing (its client not reading its answers)",
        sum(queue.write_pauses for queue in queues),
    )
