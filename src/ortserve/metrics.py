"""Prometheus metrics of one server: cheap accumulators on the event loop, exported at scrape time.

``prometheus_client``'s own Histogram costs about 1.1 µs per observation and its Counter
0.7 µs (a lock each), several percent of a 100 µs request once a request feeds eight series.
Every observation here happens on the event loop thread (transport handlers and scheduler
callbacks), so nothing takes a lock: a request appends its latency to a list and bumps one
integer, an execution appends its record, and the values are bucketed in bulk with NumPy
(every 2048 values, and at each scrape). A custom collector turns the totals into Prometheus
histogram, counter and gauge families when ``/metrics`` is scraped. Labelled series are
created once per served version at load, never per request.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import platform
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_CONTENT_TYPE
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.registry import Collector

from ortserve.core.observer import BatchRecord
from ortserve.errors import (
    DeadlineExceeded,
    DeadlineUnmeetable,
    InternalError,
    ModelNotReady,
    NotImplementedByServer,
    OrtServeError,
    Overloaded,
)

__all__ = [
    "BATCH_BUCKETS",
    "DEFAULT_LATENCY_BUCKETS",
    "OUTCOMES",
    "TRANSPORTS",
    "Histogram",
    "ServerMetrics",
    "VersionMetrics",
    "VersionState",
    "outcome_of",
    "parse_buckets",
]

_TEXT_TYPE = CONTENT_TYPE_LATEST.encode()
_OPENMETRICS_TYPE = OPENMETRICS_CONTENT_TYPE.encode()

DEFAULT_LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""Seconds: from 100 µs (a small MLP's whole request) to 10 s."""
BATCH_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
"""Rows or requests per execution."""
OUTCOMES = ("success", "invalid", "overloaded", "deadline", "unavailable", "internal")
TRANSPORTS = ("http", "grpc")
_COMPUTE_PHASES = ("input", "infer", "output")
_FOLD_AT = 2048
"""Pending values bucketed at once: bounds the memory and amortises NumPy's call overhead."""


def outcome_of(error: OrtServeError | None) -> str:
    """The outcome label of a request that ended with ``error`` (None: success)."""
    if error is None:
        return "success"
    if isinstance(error, DeadlineExceeded | DeadlineUnmeetable):  # 504: the client's deadline,
        return "deadline"  # missed in the queue or foreseen at admission (an Overloaded too)
    if isinstance(error, Overloaded):
        return "overloaded"
    if isinstance(error, ModelNotReady):
        return "unavailable"
    if isinstance(error, InternalError | NotImplementedByServer) or error.http_status >= 500:
        return "internal"
    return "invalid"


def parse_buckets(text: str) -> tuple[float, ...]:
    """Bucket bounds from ``"0.001,0.01,0.1"``: positive, strictly increasing.

    Raises:
        ValueError: not numbers, not positive, or not increasing (the CLI reports it).
    """
    bounds = tuple(float(part) for part in text.split(",") if part.strip())
    if not bounds or bounds[0] <= 0 or any(b <= a for a, b in itertools.pairwise(bounds)):
        raise ValueError(f"buckets must be positive and strictly increasing, got {text!r}")
    return bounds


class Histogram:
    """Bucket counts (not cumulative) and a sum; the last bucket is +Inf.

    ``observe`` only appends; values are bucketed in bulk by ``fold`` (on read, at scrape).
    """

    __slots__ = ("_counts", "_edges", "_sum", "bounds", "pending")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self._edges = np.asarray(self.bounds, dtype=np.float64)
        self._counts = np.zeros(len(self.bounds) + 1, dtype=np.int64)
        self._sum = 0.0
        self.pending: list[float] = []

    def observe(self, value: float) -> None:
        pending = self.pending
        pending.append(value)
        if len(pending) >= _FOLD_AT:
            self.fold()

    def add(self, values: npt.NDArray[np.float64]) -> None:
        """Bucket many values at once (``value <= bound`` counts in that bound's bucket)."""
        if values.size:
            indices = np.searchsorted(self._edges, values, side="left")
            self._counts += np.bincount(indices, minlength=self._counts.size)
            self._sum += float(values.sum())

    def fold(self) -> None:
        if self.pending:
            values = np.array(self.pending, dtype=np.float64)
            self.pending.clear()  # the same list: observers may hold it
            self.add(values)

    @property
    def count(self) -> int:
        self.fold()
        return int(self._counts.sum())

    @property
    def sum(self) -> float:
        self.fold()
        return self._sum

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus ``le`` buckets: cumulative counts ending with ``+Inf``."""
        self.fold()
        labels = [repr(bound) for bound in self.bounds] + ["+Inf"]
        return list(zip(labels, (float(c) for c in np.cumsum(self._counts)), strict=True))


@dataclass(frozen=True, slots=True)
class VersionState:
    """A served version's scrape-time state, read from the model registry."""

    model: str
    version: str
    state: str
    provider: str
    queue_depth: int
    busy_instances: int
    load_seconds: float | None
    fallback_level: int | None = None
    """The level answering now (-1: none usable); None without a fallback chain."""
    fallback_transitions: tuple[tuple[int, int, int], ...] = ()
    """(from level, to level, count)."""
    fallback_failures: tuple[tuple[int, str, int], ...] = ()
    """(level, failure kind, count)."""
    breakers_open: tuple[tuple[int, bool], ...] = ()
    """(level, open or half-open): a level traffic skips now."""


class VersionMetrics:
    """The series of one served version; also its scheduler's observer.

    Args:
        latency_buckets: bounds of the latency, queue and compute histograms (seconds).
    """

    def __init__(self, latency_buckets: Sequence[float]) -> None:
        self.outcomes = {t: dict.fromkeys(OUTCOMES, 0) for t in TRANSPORTS}
        self.latency = {t: Histogram(latency_buckets) for t in TRANSPORTS}
        self.queue_wait = Histogram(latency_buckets)
        self.compute = {phase: Histogram(latency_buckets) for phase in _COMPUTE_PHASES}
        self.batch_rows = Histogram(BATCH_BUCKETS)
        self.batch_requests = Histogram(BATCH_BUCKETS)
        self.failed_batches = 0
        self.rejected: dict[str, int] = {}
        # The pending lists themselves, appended to directly once per execution.
        self._waits = self.queue_wait.pending
        self._inputs, self._runs, self._splits = (self.compute[p].pending for p in _COMPUTE_PHASES)
        self._rows = self.batch_rows.pending
        self._requests = self.batch_requests.pending

    @property
    def requests(self) -> dict[tuple[str, str], int]:
        """Requests answered, by (transport, outcome)."""
        return {(t, o): n for t, counts in self.outcomes.items() for o, n in counts.items()}

    def record_request(self, transport: str, outcome: str, seconds: float) -> None:
        """One request answered: its outcome (one of OUTCOMES) and end-to-end latency."""
        counts = self.outcomes.get(transport)
        if counts is None:
            counts = self.outcomes[transport] = dict.fromkeys(OUTCOMES, 0)
            self.latency[transport] = Histogram(self.queue_wait.bounds)
        counts[outcome] += 1
        self.latency[transport].observe(seconds)

    def on_batch(self, record: BatchRecord) -> None:
        if record.failed:
            self.failed_batches += 1
            return
        self._waits.extend(record.queue_waits_s)
        inputs = self._inputs
        inputs.append(record.assemble_s)
        self._runs.append(record.run_s)
        self._splits.append(record.split_s)
        self._rows.append(record.rows)
        self._requests.append(record.requests)
        if len(inputs) >= _FOLD_AT:
            self.fold()

    def fold(self) -> None:
        """Bucket every pending observation (before a scrape)."""
        for histogram in self._histograms():
            histogram.fold()

    def _histograms(self) -> Iterator[Histogram]:
        yield self.queue_wait
        yield from self.compute.values()
        yield self.batch_rows
        yield self.batch_requests
        yield from self.latency.values()

    def on_rejected(self, error: OrtServeError) -> None:
        reason = outcome_of(error)
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


class ServerMetrics:
    """The server's own Prometheus registry (not the global one, so tests can run several).

    Args:
        states: returns every served version's state at scrape time.
        inflight: returns the requests being handled now, per transport.
        latency_buckets: histogram bounds in seconds.
    """

    def __init__(
        self,
        states: Callable[[], Iterable[VersionState]],
        inflight: Callable[[], dict[str, int]],
        latency_buckets: Sequence[float] = DEFAULT_LATENCY_BUCKETS,
    ) -> None:
        self.latency_buckets = tuple(latency_buckets)
        self.versions: dict[tuple[str, str], VersionMetrics] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Exporter(self, states, inflight))
        # The families every Prometheus client exports (process_*, python_gc_*, python_info),
        # read at scrape time only, and the build-info gauge dashboards join versions on.
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.registry.register(_BuildInfo())

    def version(self, model: str, version: str) -> VersionMetrics:
        """The series of one version, created at load (and kept across reloads)."""
        found = self.versions.get((model, version))
        if found is None:
            found = self.versions[(model, version)] = VersionMetrics(self.latency_buckets)
        return found

    def exposition(self) -> bytes:
        """The Prometheus text format of every family."""
        return generate_latest(self.registry)

    def negotiated(self, accept: bytes | None) -> tuple[bytes, bytes]:
        """Every family as (body, content type): OpenMetrics when ``accept`` asks for it
        (Prometheus does when it prefers it), else the Prometheus text format."""
        if accept is not None and b"application/openmetrics-text" in accept:
            return openmetrics_latest(self.registry), _OPENMETRICS_TYPE  # type: ignore[no-untyped-call]
        return self.exposition(), _TEXT_TYPE


class _BuildInfo(Collector):
    """``ortserve_build_info{version, onnxruntime_version, python_version} 1``."""

    def __init__(self) -> None:
        from ortserve import __version__

        try:
            runtime = importlib.metadata.version("onnxruntime")
        except importlib.metadata.PackageNotFoundError:  # a differently named build (-gpu)
            runtime = "unknown"
        self._labels = [__version__, runtime, platform.python_version()]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "ortserve_build_info",
            "ortserve's version and those of ONNX Runtime and Python; always 1",
            labels=["version", "onnxruntime_version", "python_version"],
        )
        family.add_metric(self._labels, 1)
        yield family


class _Exporter(Collector):
    def __init__(
        self,
        metrics: ServerMetrics,
        states: Callable[[], Iterable[VersionState]],
        inflight: Callable[[], dict[str, int]],
    ) -> None:
        self._metrics = metrics
        self._states = states
        self._inflight = inflight

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
        versions = sorted(self._metrics.versions.items())
        for _, series in versions:
            series.fold()
        yield from _request_families(versions)
        yield from _batch_families(versions)
        yield from _state_families(list(self._states()))
        inflight = GaugeMetricFamily(
            "ortserve_inflight_requests", "Requests being handled now", labels=["transport"]
        )
        for transport, count in sorted(self._inflight().items()):
            inflight.add_metric([transport], count)
        yield inflight


_Versions = list[tuple[tuple[str, str], VersionMetrics]]


def _histogram(family: HistogramMetricFamily, labels: list[str], histogram: Histogram) -> None:
    family.add_metric(labels, histogram.cumulative(), histogram.sum)


def _request_families(versions: _Versions) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
    requests = CounterMetricFamily(
        "ortserve_requests",
        "Inference requests answered, by outcome and transport",
        labels=["model", "version", "transport", "outcome"],
    )
    latency = HistogramMetricFamily(
        "ortserve_request_duration_seconds",
        "End-to-end request latency inside the server (decode to encode)",
        labels=["model", "version", "transport"],
    )
    rejected = CounterMetricFamily(
        "ortserve_scheduler_rejections",
        "Requests the scheduler refused at admission or dropped when their deadline passed",
        labels=["model", "version", "reason"],
    )
    for (model, version), series in versions:
        for (transport, outcome), count in sorted(series.requests.items()):
            requests.add_metric([model, version, transport, outcome], count)
        for transport, histogram in sorted(series.latency.items()):
            if histogram.count:
                _histogram(latency, [model, version, transport], histogram)
        for reason, count in sorted(series.rejected.items()):
            rejected.add_metric([model, version, reason], count)
    yield from (requests, latency, rejected)


def _batch_families(versions: _Versions) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
    labels = ["model", "version"]
    queue = HistogramMetricFamily(
        "ortserve_queue_wait_seconds", "Time each request waited in the queue", labels=labels
    )
    compute = HistogramMetricFamily(
        "ortserve_compute_seconds",
        "Per execution: input assembly, ONNX Runtime run, output split",
        labels=[*labels, "phase"],
    )
    rows = HistogramMetricFamily("ortserve_batch_rows", "Rows per execution", labels=labels)
    requests = HistogramMetricFamily("ortserve_batch_requests", "Requests per execution", labels=labels)
    failed = CounterMetricFamily("ortserve_batch_failures", "Executions that failed", labels=labels)
    for (model, version), series in versions:
        _histogram(queue, [model, version], series.queue_wait)
        for phase in _COMPUTE_PHASES:
            _histogram(compute, [model, version, phase], series.compute[phase])
        _histogram(rows, [model, version], series.batch_rows)
        _histogram(requests, [model, version], series.batch_requests)
        failed.add_metric([model, version], series.failed_batches)
    yield from (queue, compute, rows, requests, failed)


def _state_families(states: list[VersionState]) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    labels = ["model", "version"]
    depth = GaugeMetricFamily("ortserve_queue_depth", "Requests waiting, not yet running", labels=labels)
    busy = GaugeMetricFamily("ortserve_busy_instances", "Executions running now", labels=labels)
    state = GaugeMetricFamily(
        "ortserve_model_state", "1 for the version's current state", labels=[*labels, "state"]
    )
    provider = GaugeMetricFamily(
        "ortserve_model_execution_provider",
        "1 for the execution provider the version's session runs on",
        labels=[*labels, "provider"],
    )
    load = GaugeMetricFamily("ortserve_model_load_duration_seconds", "Load and warm-up time", labels=labels)
    for s in states:
        depth.add_metric([s.model, s.version], s.queue_depth)
        busy.add_metric([s.model, s.version], s.busy_instances)
        for name in ("loading", "ready", "failed", "draining", "unloading", "unloaded"):
            state.add_metric([s.model, s.version, name], 1.0 if s.state == name else 0.0)
        if s.provider:
            provider.add_metric([s.model, s.version, s.provider], 1.0)
        if s.load_seconds is not None:
            load.add_metric([s.model, s.version], s.load_seconds)
    yield from (depth, busy, state, provider, load)
    yield from _fallback_families(states)


def _fallback_families(states: list[VersionState]) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    labels = ["model", "version"]
    level = GaugeMetricFamily(
        "ortserve_fallback_level",
        "Execution level answering now: 0 primary, 1 other device, 2 fallback session, 3 default "
        "answer, -1 none usable",
        labels=labels,
    )
    moves = CounterMetricFamily(
        "ortserve_fallback_transitions", "Traffic moves between levels", labels=[*labels, "from", "to"]
    )
    failures = CounterMetricFamily(
        "ortserve_fallback_failures", "Failed runs by level and kind", labels=[*labels, "level", "kind"]
    )
    breakers = GaugeMetricFamily(
        "ortserve_breaker_open",
        "1 while a level's circuit breaker is open or half-open (traffic skips the level)",
        labels=[*labels, "level"],
    )
    for s in states:
        if s.fallback_level is None:
            continue
        level.add_metric([s.model, s.version], s.fallback_level)
        for at, is_open in s.breakers_open:
            breakers.add_metric([s.model, s.version, str(at)], 1.0 if is_open else 0.0)
        for source, target, count in s.fallback_transitions:
            moves.add_metric([s.model, s.version, str(source), str(target)], count)
        for at, kind, count in s.fallback_failures:
            failures.add_metric([s.model, s.version, str(at), kind], count)
    yield from (level, moves, failures, breakers)
