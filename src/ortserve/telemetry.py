"""Per-request accounting both transports share: request ids, outcomes, latency, access log, spans."""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from ortserve.core.observer import SchedulerObserver, make_observer_chain
from ortserve.core.types import InferRequest
from ortserve.errors import OrtServeError
from ortserve.logs import MODEL, REQUEST_ID, TRACE, VERSION
from ortserve.metrics import ServerMetrics, VersionMetrics, outcome_of
from ortserve.statistics import ServerStatistics, VersionStatistics
from ortserve.tracing import RequestTrace, Tracing

if TYPE_CHECKING:
    import asyncio

    from ortserve.capture import Sample

__all__ = ["RequestScope", "Telemetry", "echoable_id"]

access_logger = logging.getLogger("ortserve.access")

_MAX_ECHOED_ID = 256
_RECENTLY_FORGOTTEN = 64
"""Unloaded versions remembered, so a late answer from one does not bring its series back."""


class _Cancellable(Protocol):
    def cancelled(self) -> bool: ...


class _VersionRecorder:
    __slots__ = ("metrics", "statistics")

    def __init__(self, metrics: VersionMetrics | None, statistics: VersionStatistics | None) -> None:
        self.metrics = metrics
        self.statistics = statistics

    def record(self, transport: str, outcome: str, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.record_request(transport, outcome, seconds)
        if self.statistics is not None:
            self.statistics.record_request(outcome == "success", seconds)


class Telemetry:
    """Where transports report requests and where the registry gets each version's observer.

    Args:
        statistics: the statistics extension's totals (always kept; they are cheap).
        metrics: Prometheus series, or None when metrics are off.
        tracing: OpenTelemetry spans, or None when tracing is off.
        access_log: log one line per request to the ``ortserve.access`` logger.
    """

    def __init__(
        self,
        statistics: ServerStatistics,
        metrics: ServerMetrics | None = None,
        tracing: Tracing | None = None,
        access_log: bool = False,
    ) -> None:
        self.statistics = statistics
        self.metrics = metrics
        self.tracing = tracing
        self.access_log = access_log
        self.live: set[RequestScope] = set()
        self._versions: dict[tuple[str, str], _VersionRecorder] = {}
        self._latest: dict[str, str] = {}
        self._unattributed = _VersionRecorder(None, None)
        self._forgotten: deque[tuple[str, str]] = deque(maxlen=_RECENTLY_FORGOTTEN)

    def observer_for(self, model: str, version: str) -> SchedulerObserver:
        """The scheduler observer of a version being loaded; also prepares its request series."""
        metrics, statistics = self._register(model, version)
        observers: list[SchedulerObserver] = [statistics]
        if metrics is not None:
            observers.append(metrics)
        if self.tracing is not None:
            observers.append(self.tracing.observer(model, version))
        return observers[0] if len(observers) == 1 else make_observer_chain(*observers)

    def _register(self, model: str, version: str) -> tuple[VersionMetrics | None, VersionStatistics]:
        metrics = None if self.metrics is None else self.metrics.version(model, version)
        statistics = self.statistics.version(model, version)
        self._versions[(model, version)] = _VersionRecorder(metrics, statistics)
        latest = self._latest.get(model)
        if latest is None or _number(version) > _number(latest):
            self._latest[model] = version
        return metrics, statistics

    def forget(self, model: str, version: str) -> None:
        """A version was unloaded: drop its metric series, statistics and timeline.

        Without this every reload left one set of series behind (a dozen histograms and
        their pending observations), and a server reloading all day grew without bound; Triton
        likewise reports only the versions it serves.
        """
        key = (model, version)
        self._versions.pop(key, None)
        self.statistics.versions.pop(key, None)
        if self.metrics is not None:
            self.metrics.versions.pop(key, None)
        if self.tracing is not None:
            self.tracing.timelines.pop(key, None)
        self._forgotten.append(key)
        if self._latest.get(model) == version:
            remaining = [v for m, v in self._versions if m == model]
            if remaining:
                self._latest[model] = max(remaining, key=_number)
            else:
                del self._latest[model]

    def begin(
        self,
        transport: str,
        model: str,
        version: str | None,
        request_id: str | None,
        traceparent: str | None,
        path: str = "",
        header: Callable[[str], str | None] | None = None,
        body: bytes = b"",
    ) -> RequestScope:
        """Start accounting for one inference request; end it with ``finish`` or ``abandon``.

        ``path``: an HTTP request's path (its span is named by the route template).
        ``header`` and ``body`` are the Exchange's (what a capture record keeps); taking them
        here lets a server without capture call this very method as ``Exchange.begin``."""
        trace = None
        if self.tracing is not None:
            trace = self.tracing.begin(transport, f"{transport} infer {model}", traceparent, model, path)
        scope = RequestScope(self, transport, model, version, request_id, trace)
        self.live.add(scope)
        return scope

    def refused(
        self, transport: str, model: str, version: str | None, error: OrtServeError, seconds: float
    ) -> None:
        """A request refused at the edge, before it was decoded: counted as a finished scope
        would count it, without building one (refusals come by the thousand under overload)."""
        self.recorder(model, version).record(transport, outcome_of(error), seconds)

    def inflight(self) -> dict[str, int]:
        """Requests being handled now, per transport (read at scrape time).

        A request whose client went away has its pending future cancelled and is never
        finished; it is dropped here instead of costing a callback per request.
        """
        counts = dict.fromkeys(("http", "grpc"), 0)
        for scope in list(self.live):
            if scope.pending is not None and scope.pending.cancelled():
                self.live.discard(scope)
            else:
                counts[scope.transport] = counts.get(scope.transport, 0) + 1
        return counts

    def recorder(self, model: str, version: str | None, answered: bool = False) -> _VersionRecorder:
        """A request's version: the one it named, or the model's highest when it named none.

        A version without a scheduler (a pipeline) gets its series when it first answers:
        an answer proves the model exists, so unknown names never become labels.
        """
        if version is None:
            version = self._latest.get(model)
            if version is None:
                return self._unattributed_recorder()
        found = self._versions.get((model, version))
        if found is not None:
            return found
        if not answered or (model, version) in self._forgotten:
            return self._unattributed_recorder()
        self._register(model, version)
        return self._versions[(model, version)]

    def _unattributed_recorder(self) -> _VersionRecorder:
        """Requests for unknown models count under model "" (never a label per unknown name)."""
        if self._unattributed.metrics is None and self.metrics is not None:
            self._unattributed.metrics = self.metrics.version("", "")
        return self._unattributed


class RequestScope:
    """One request's accounting, from routing to the encoded answer."""

    __slots__ = (
        "_started",
        "_telemetry",
        "model",
        "pending",
        "request_id",
        "routed",
        "sample",
        "trace",
        "transport",
        "version",
    )

    def __init__(
        self,
        telemetry: Telemetry,
        transport: str,
        model: str,
        version: str | None,
        request_id: str | None,
        trace: RequestTrace | None,
    ) -> None:
        self._telemetry = telemetry
        self._started = time.perf_counter()
        self.transport = transport
        self.model = model
        self.version = version
        self.request_id = request_id
        self.trace = trace
        self.pending: _Cancellable | None = None
        """The queued request's future, set by transports that hold no task per request."""
        self.sample: Sample | None = None
        """Set when the request was sampled for capture (the Exchange offers it when finished)."""
        self.routed: asyncio.Future[Any] | None = None
        """A request a model's router chose a version for but did not submit itself (an LLM
        generation, a pipeline): settled when the request finishes, for the router's outcomes."""

    def identify(self, request: InferRequest) -> None:
        """The request is decoded: its OIP ``id`` wins over the header and the answer carries it."""
        if request.id:
            self.request_id = request.id
        elif self.request_id is not None:
            request.id = self.request_id
        if self.trace is not None:
            self.trace.decoded = time.monotonic()

    def inferred(self, version: str) -> None:
        """The model answered (from ``version``); encoding starts."""
        self.version = version
        if self.trace is not None:
            self.trace.inferred = time.monotonic()

    def echoed_id(self) -> bytes | None:
        """The request id as a response header value, if it is safe to echo."""
        return echoable_id(self.request_id)

    def finish(self, error: OrtServeError | None, status: int | str) -> None:
        """Record the outcome and latency, write the access log line, end the trace."""
        seconds = time.perf_counter() - self._started
        telemetry = self._telemetry
        telemetry.live.discard(self)
        outcome = "success" if error is None else outcome_of(error)
        recorder = telemetry.recorder(self.model, self.version, error is None)
        recorder.record(self.transport, outcome, seconds)
        if telemetry.access_log:
            self._log_access(outcome, status, seconds)
        if self.trace is not None and telemetry.tracing is not None:
            telemetry.tracing.end(self.trace, self.model, self.version, outcome, self.request_id, status)
        routed = self.routed
        if routed is not None and not routed.done():
            if error is None:
                routed.set_result(None)
            else:
                routed.set_exception(error)
                routed.exception()  # retrieved: the transport answers it

    def abandon(self) -> None:
        """The client went away before an answer: only the in-flight count changes (and a
        router waiting for the outcome is told the request was withdrawn)."""
        self._telemetry.live.discard(self)
        if self.routed is not None:
            self.routed.cancel()

    @contextlib.contextmanager
    def bound(self) -> Iterator[None]:
        """Tag every log line written inside with this request's id, model and version.

        Transports without a task per request share one context across requests, so the
        variables are set only around the code that may log, and restored after.
        """
        tokens = (REQUEST_ID.set(self.request_id), MODEL.set(self.model), VERSION.set(self.version))
        traced = TRACE.set(None if self.trace is None else self.trace.ids())
        try:
            yield
        finally:
            TRACE.reset(traced)
            VERSION.reset(tokens[2])
            MODEL.reset(tokens[1])
            REQUEST_ID.reset(tokens[0])

    def _log_access(self, outcome: str, status: int | str, seconds: float) -> None:
        access_logger.info(
            "%s infer %s/%s %s %s %.3f ms",
            self.transport,
            self.model,
            self.version or "-",
            status,
            outcome,
            seconds * 1e3,
            extra={
                "request_id": self.request_id,
                "model": self.model,
                "version": self.version,
                "transport": self.transport,
                "status": status,
                "outcome": outcome,
                "latency_ms": round(seconds * 1e3, 3),
                **({} if self.trace is None else dict(zip(("trace_id", "span_id"), self.trace.ids()))),
            },
        )


def echoable_id(request_id: str | None) -> bytes | None:
    """A request id as a response header value, if it is safe to echo (short, printable ASCII:
    nothing a client sends may split a header or a log line)."""
    if (
        request_id is None
        or len(request_id) > _MAX_ECHOED_ID
        or not (request_id.isascii() and request_id.isprintable())
    ):
        return None
    return request_id.encode("ascii")


def _number(version: str) -> int:
    return int(version) if version.isascii() and version.isdigit() else -1
