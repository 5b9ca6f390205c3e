"""Prometheus exposition: the ``--metrics-port`` listener and the ``/metrics`` route handler."""

from __future__ import annotations

from ortserve.core.model import ServedVersion
from ortserve.metrics import ServerMetrics, VersionState
from ortserve.repository.registry import ModelRegistry
from ortserve.resilience.breaker import BreakerState
from ortserve.server.connections import ConnectionLimit
from ortserve.server.http.app import RouteHandler
from ortserve.server.http.connection import ConnectionLimits
from ortserve.server.http.encoding import answer_coding, compress_answer
from ortserve.server.http.listener import HttpListener
from ortserve.server.http.messages import HttpRequest, HttpResponse, RouteResult, json_response
from ortserve.server.http.methods import answer_methods, method_not_allowed

__all__ = ["MetricsListener", "metrics_route", "version_states"]

_METRICS_LIMITS = ConnectionLimits(max_body_bytes=64 * 1024, keepalive_timeout_s=75.0)
# Scrapers need a few connections; the cap keeps this port from using the descriptors that
# --max-connections leaves for everything else.
_METRICS_CONNECTIONS = 64


def _exposition(metrics: ServerMetrics, request: HttpRequest) -> HttpResponse:
    body, content_type = metrics.negotiated(request.headers.get(b"accept"))
    return HttpResponse(200, [body], content_type)


def metrics_route(metrics: ServerMetrics) -> RouteHandler:
    """``GET /metrics`` for the HTTP app (the same families as the metrics port)."""

    async def handler(request: HttpRequest) -> HttpResponse:
        return _exposition(metrics, request)

    return handler


class MetricsListener:
    """A listener of its own that answers ``GET /metrics`` and nothing else.

    Args:
        metrics: the server's metrics.
    """

    def __init__(self, metrics: ServerMetrics) -> None:
        self._metrics = metrics
        self._listener = HttpListener(self._handle, _METRICS_LIMITS, ConnectionLimit(_METRICS_CONNECTIONS))

    def _handle(self, request: HttpRequest) -> RouteResult:
        result = answer_methods(request, self._route)
        coding = answer_coding(request)  # Prometheus sends Accept-Encoding: gzip
        return result if coding is None else compress_answer(result, coding)

    def _route(self, request: HttpRequest) -> HttpResponse:
        if request.path != "/metrics":
            return json_response(404, b'{"error":"only /metrics is served on this port"}')
        if request.method != "GET":
            return method_not_allowed("GET")
        return _exposition(self._metrics, request)

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port."""
        return await self._listener.start(host, port)

    async def stop(self, timeout_s: float) -> None:
        """Close the socket and idle connections; wait for a scrape in progress."""
        self._listener.stop_accepting()
        await self._listener.wait_closed(timeout_s)


def version_states(registry: ModelRegistry) -> list[VersionState]:
    """Every served version's state; a model with no loaded version reports version ""."""
    states: list[VersionState] = []
    for entry in registry.entries():
        if not entry.versions:
            states.append(VersionState(entry.name, "", entry.state.value, "", 0, 0, None))
        for number, served in sorted(entry.versions.items()):
            scheduler = getattr(served, "scheduler", None)  # pipelines run on their models' queues
            guard = served.guard if isinstance(served, ServedVersion) else None
            chain = None if guard is None else guard.chain
            level = None if chain is None else chain.current_level()
            states.append(
                VersionState(
                    entry.name,
                    str(number),
                    served.state.value,
                    served.info.providers[0] if served.info.providers else "",
                    0 if scheduler is None else scheduler.queue_depth,
                    0 if scheduler is None else scheduler.busy_instances,
                    entry.load_seconds.get(number),
                    None if chain is None else (-1 if level is None else level),
                    ()
                    if chain is None
                    else tuple((a, b, n) for (a, b), n in sorted(chain.transitions.items())),
                    () if chain is None else tuple((a, k, n) for (a, k), n in sorted(chain.failures.items())),
                    ()
                    if chain is None
                    else tuple(
                        (at, b.state is not BreakerState.CLOSED) for at, b in enumerate(chain.breakers)
                    ),
                )
            )
    return states
