"""Prometheus counters of model lifecycle transitions: loads, failed loads, unloads, load time.

Fed by the lifecycle manager (:class:`~ortserve.repository.manager.LifecycleEvents`) on the
event loop; exported at scrape time by a collector in the server's own registry. Series are
created per model as transitions happen, a handful per reload, never per request.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from ortserve.metrics import Histogram

__all__ = ["LOAD_BUCKETS", "LifecycleMetrics"]

LOAD_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Seconds: from a small MLP's load and warm-up to a large model's."""


class LifecycleMetrics(Collector):
    """Counts per model; one load-duration histogram per model."""

    def __init__(self) -> None:
        self.loads: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.unloads: Counter[str] = Counter()
        self._durations: dict[str, Histogram] = {}

    def loaded(self, model: str, version: str, seconds: float) -> None:
        self.loads[model] += 1
        self._durations.setdefault(model, Histogram(LOAD_BUCKETS)).observe(seconds)

    def load_failed(self, model: str, version: str) -> None:
        self.failures[model] += 1

    def unloaded(self, model: str, version: str) -> None:
        self.unloads[model] += 1

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        families = (
            ("ortserve_model_loads", "Versions loaded and warmed up (reloads included)", self.loads),
            ("ortserve_model_load_failures", "Version or configuration loads that failed", self.failures),
            ("ortserve_model_unloads", "Versions drained and released", self.unloads),
        )
        for name, documentation, counts in families:
            family = CounterMetricFamily(name, documentation, labels=["model"])
            for model, count in sorted(counts.items()):
                family.add_metric([model], count)
            yield family
        durations = HistogramMetricFamily(
            "ortserve_model_load_seconds", "Time from the start of a load to serving", labels=["model"]
        )
        for model, histogram in sorted(self._durations.items()):
            durations.add_metric([model], histogram.cumulative(), histogram.sum)
        yield durations
