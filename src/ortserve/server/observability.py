"""The server's telemetry built from its settings: metrics, statistics, tracing and their listener."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ortserve.gc_pauses import gc_pauses
from ortserve.lifecycle_metrics import LifecycleMetrics
from ortserve.metrics import DEFAULT_LATENCY_BUCKETS, ServerMetrics
from ortserve.repository.registry import ModelRegistry
from ortserve.server.http.app import HttpApp
from ortserve.server.metrics_listener import MetricsListener, metrics_route, version_states
from ortserve.settings import ServerSettings
from ortserve.statistics import ServerStatistics
from ortserve.telemetry import Telemetry
from ortserve.trace_settings import TraceControl
from ortserve.tracing import build_tracing

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

__all__ = ["Observability"]

logger = logging.getLogger(__name__)


class Observability:
    """Owns the telemetry of one server and the ``--metrics-port`` listener.

    Args:
        settings: metrics, buckets, access log and tracing settings.
        registry: read at scrape time for queue depth, model state and providers; its
            ``observers`` hook is set so every version loaded reports its executions.
    """

    def __init__(self, settings: ServerSettings, registry: ModelRegistry) -> None:
        self.statistics = ServerStatistics()
        self.metrics: ServerMetrics | None = None
        self.telemetry = Telemetry(self.statistics, access_log=settings.access_log)
        if settings.metrics:
            self.metrics = ServerMetrics(
                lambda: version_states(registry),
                self.telemetry.inflight,
                settings.metrics_buckets or DEFAULT_LATENCY_BUCKETS,
            )
            self.telemetry.metrics = self.metrics
        self._provider: TracerProvider | None = None
        built = build_tracing(settings.trace_sampling_ratio, settings.trace_exporter)
        self.trace_control = TraceControl(False)
        """The trace settings (level OFF and not settable when tracing was not built)."""
        if built is not None:
            self.telemetry.tracing, self._provider = built
            self.trace_control = built[0].control or self.trace_control
        registry.observers = self.telemetry.observer_for
        self.lifecycle_events: LifecycleMetrics | None = None
        """Load/unload counters for the lifecycle manager (None with metrics off)."""
        if self.metrics is not None:
            self.lifecycle_events = LifecycleMetrics()
            self.metrics.registry.register(self.lifecycle_events)
            self.metrics.registry.register(gc_pauses())
        self._listener: MetricsListener | None = None
        if self.metrics is not None and settings.metrics_port >= 0:
            self._listener = MetricsListener(self.metrics)

    def add_routes(self, app: HttpApp) -> None:
        """``GET /metrics`` on the HTTP port too (when metrics are on)."""
        if self.metrics is not None:
            app.add_route("GET", "/metrics", metrics_route(self.metrics))

    async def start(self, host: str, port: int) -> int | None:
        """Open the metrics listener; returns its port, None when it is off."""
        if self._listener is None:
            return None
        bound = await self._listener.start(host, port)
        logger.info("Prometheus metrics on http://%s:%d/metrics", host, bound)
        return bound

    async def stop(self, timeout_s: float) -> None:
        """Close the metrics listener and flush spans not yet exported."""
        if self._listener is not None:
            await self._listener.stop(timeout_s)
        if self._provider is not None:
            await asyncio.to_thread(self._provider.shutdown)
