"""OpenTelemetry request spans (request -> decode, queue, batch execution, encode); optional.

Spans are created when the request ends, from timestamps taken on the way, so an unsampled
request costs one ``start_span`` and a server without tracing (OpenTelemetry absent or the
sampling ratio 0) costs nothing: the transports hold ``None`` instead of a :class:`Tracing`.
The queue and batch-execution spans come from the version's recent executions: the one that
started after the request was queued and ended before it resumed. With one instance per
version that execution is exactly the request's; with several it is the latest such one.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ortserve.core.observer import BatchRecord
from ortserve.errors import ConfigError, OrtServeError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.trace import Span, Tracer

__all__ = ["BatchTimeline", "RequestTrace", "Tracing", "build_tracing", "tracer_provider"]

logger = logging.getLogger(__name__)

_RECENT_BATCHES = 64


@dataclass(frozen=True, slots=True)
class _Execution:
    start: float
    end: float
    record: BatchRecord


class BatchTimeline:
    """A version's recent executions on the monotonic clock; its scheduler's observer."""

    def __init__(self) -> None:
        self.recent: deque[_Execution] = deque(maxlen=_RECENT_BATCHES)

    def on_batch(self, record: BatchRecord) -> None:
        end = time.monotonic()  # the scheduler reports right after splitting the outputs
        start = end - record.split_s - record.run_s - record.assemble_s
        self.recent.append(_Execution(start, end, record))

    def on_rejected(self, error: OrtServeError) -> None:
        pass

    def find(self, queued: float, resumed: float) -> _Execution | None:
        """The latest execution that started after ``queued`` and ended by ``resumed``."""
        for execution in reversed(self.recent):
            if execution.end <= resumed and execution.start >= queued:
                return execution
        return None


@dataclass(slots=True)
class RequestTrace:
    """A sampled request's root span and the monotonic times of its phases."""

    span: Span
    started: float
    epoch_ns: int
    decoded: float = 0.0
    inferred: float = 0.0

    def ns(self, monotonic: float) -> int:
        return self.epoch_ns + int((monotonic - self.started) * 1e9)


class Tracing:
    """Starts request spans (continuing a W3C ``traceparent``) and ends them with children.

    Args:
        tracer: where spans go; its provider's sampler decides which requests are traced.
    """

    def __init__(self, tracer: Tracer) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._tracer = tracer
        self._propagator = TraceContextTextMapPropagator()
        self.timelines: dict[tuple[str, str], BatchTimeline] = {}

    def observer(self, model: str, version: str) -> BatchTimeline:
        """The execution timeline of one version (its scheduler observer)."""
        found = self.timelines.get((model, version))
        if found is None:
            found = self.timelines[(model, version)] = BatchTimeline()
        return found

    def begin(self, transport: str, route: str, traceparent: str | None) -> RequestTrace | None:
        """Start the request span; None when the sampler drops the request."""
        from opentelemetry.trace import SpanKind

        carrier = {"traceparent": traceparent} if traceparent else {}
        parent = self._propagator.extract(carrier)
        epoch_ns = time.time_ns()
        span = self._tracer.start_span(
            route,
            context=parent,
            kind=SpanKind.SERVER,
            start_time=epoch_ns,
            attributes={"rpc.system": transport},
        )
        if not span.is_recording():
            return None
        return RequestTrace(span, time.monotonic(), epoch_ns)

    def end(
        self, trace: RequestTrace, model: str, version: str | None, outcome: str, request_id: str | None
    ) -> None:
        """Add the phase spans and end the request span."""
        from opentelemetry.trace import Status, StatusCode, set_span_in_context

        now = time.monotonic()
        root = trace.span
        root.set_attributes({"ortserve.model": model, "ortserve.outcome": outcome})
        if version is not None:
            root.set_attribute("ortserve.version", version)
        if request_id is not None:
            root.set_attribute("ortserve.request_id", request_id)
        if outcome != "success":
            root.set_status(Status(StatusCode.ERROR, outcome))
        context = set_span_in_context(root)
        decoded = trace.decoded or now
        self._span("decode", context, trace.ns(trace.started), trace.ns(decoded))
        timeline = None if version is None else self.timelines.get((model, version))
        execution = None if timeline is None or not trace.inferred else timeline.find(decoded, trace.inferred)
        if execution is not None:
            self._span("queue", context, trace.ns(decoded), trace.ns(execution.start))
            self._execution_span(context, trace, execution)
        if trace.inferred:
            self._span("encode", context, trace.ns(trace.inferred), trace.ns(now))
        root.end(end_time=trace.ns(now))

    def _span(self, name: str, context: object, start_ns: int, end_ns: int) -> Span:
        span = self._tracer.start_span(name, context=context, start_time=start_ns)  # type: ignore[arg-type]
        span.end(end_time=max(start_ns, end_ns))
        return span

    def _execution_span(self, context: object, trace: RequestTrace, execution: _Execution) -> None:
        record = execution.record
        span = self._tracer.start_span(
            "batch execution",
            context=context,  # type: ignore[arg-type]
            start_time=trace.ns(execution.start),
            attributes={
                "ortserve.batch.rows": record.rows,
                "ortserve.batch.requests": record.requests,
                "ortserve.compute.input_s": record.assemble_s,
                "ortserve.compute.infer_s": record.run_s,
                "ortserve.compute.output_s": record.split_s,
            },
        )
        span.end(end_time=trace.ns(execution.end))


def tracer_provider(sampling_ratio: float, processor: SpanProcessor) -> TracerProvider:
    """A provider that samples ``sampling_ratio`` of new traces and follows a caller's choice."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES are read by Resource.create(); "ortserve"
    # only replaces the SDK's "unknown_service" when neither names the service.
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "ortserve"}))
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(sampling_ratio)), resource=resource)
    provider.add_span_processor(processor)
    return provider


def build_tracing(sampling_ratio: float, exporter: str) -> tuple[Tracing, TracerProvider] | None:
    """Tracing for the server, or None when the ratio is 0 or OpenTelemetry is not installed.

    Args:
        sampling_ratio: fraction of new traces recorded (a caller's sampled flag wins).
        exporter: ``otlp`` (needs opentelemetry-exporter-otlp; OTEL_EXPORTER_OTLP_* apply)
            or ``console``.

    Raises:
        ConfigError: an unknown exporter, or ``otlp`` without its package.
    """
    if sampling_ratio <= 0:
        return None
    try:
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        logger.warning("tracing is off: install ortserve[otel] for OpenTelemetry")
        return None
    if exporter == "console":
        processor = BatchSpanProcessor(ConsoleSpanExporter())
    elif exporter == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise ConfigError(
                "--trace-exporter otlp needs opentelemetry-exporter-otlp-proto-http (pip install 'ortserve[otel]')"
            ) from exc
        processor = BatchSpanProcessor(OTLPSpanExporter())
    else:
        raise ConfigError(f"unknown trace exporter {exporter!r}: use otlp or console")
    provider = tracer_provider(sampling_ratio, processor)
    return Tracing(provider.get_tracer("ortserve")), provider
