"""OpenTelemetry request spans (request -> decode, queue, batch execution, encode); optional.

Spans are created when the request ends, from timestamps taken on the way, so an unsampled
request costs one ``start_span`` and a server without tracing (OpenTelemetry absent or the
sampling ratio 0) costs nothing: the transports hold ``None`` instead of a :class:`Tracing`.
The queue and batch-execution spans come from the version's recent executions: the one that
started after the request was queued and ended before it resumed. With one instance per
version that execution is exactly the request's; with several it is the latest such one.

Request spans follow OpenTelemetry's semantic conventions: an HTTP one is named
``POST /v2/models/{model}/infer`` (the route template) with ``http.request.method``,
``http.route`` and ``http.response.status_code``; a gRPC one carries ``rpc.system``,
``rpc.service`` and ``rpc.grpc.status_code``. Which requests are traced is the trace
settings' decision (trace_settings.py: level, rate, count), made before a span is started.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ortserve.core.observer import BatchRecord
from ortserve.errors import ConfigError, OrtServeError
from ortserve.trace_settings import TraceControl, rate_of_ratio

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.trace import Span, Tracer

__all__ = [
    "BatchTimeline",
    "RequestTrace",
    "Tracing",
    "build_tracing",
    "export_destination",
    "route_template",
    "tracer_provider",
]

logger = logging.getLogger(__name__)

_RECENT_BATCHES = 64
_GRPC_SERVICE = "inference.GRPCInferenceService"
_GRPC_CODES = {
    "OK": 0,
    "CANCELLED": 1,
    "UNKNOWN": 2,
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "ABORTED": 10,
    "OUT_OF_RANGE": 11,
    "UNIMPLEMENTED": 12,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
    "DATA_LOSS": 15,
    "UNAUTHENTICATED": 16,
}
_MODEL_SEGMENT = re.compile(r"/models/[^/]+")
_VERSION_SEGMENT = re.compile(r"/versions/[^/]+")
_INFER_ROUTE = "/v2/models/{model}/infer"


def route_template(path: str) -> str:
    """``http.route`` of a request path: model and version names become ``{model}`` and
    ``{version}`` (a span's name and attributes must not grow with what clients send)."""
    if not path:
        return _INFER_ROUTE
    template = _MODEL_SEGMENT.sub("/models/{model}", path.partition("?")[0])
    return _VERSION_SEGMENT.sub("/versions/{version}", template)[:256]


def _caller_sampled(traceparent: str | None) -> bool:
    """The W3C ``traceparent``'s sampled flag (``00-<trace>-<span>-01``)."""
    if not traceparent or len(traceparent) < 55:
        return False
    try:
        return bool(int(traceparent[53:55], 16) & 1)
    except ValueError:
        return False


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
    transport: str = "http"

    def ns(self, monotonic: float) -> int:
        return self.epoch_ns + int((monotonic - self.started) * 1e9)

    def ids(self) -> tuple[str, str]:
        """The request span's (trace_id, span_id) in hex, for log records."""
        context = self.span.get_span_context()
        return f"{context.trace_id:032x}", f"{context.span_id:016x}"


class Tracing:
    """Starts request spans (continuing a W3C ``traceparent``) and ends them with children.

    Args:
        tracer: where spans go; its provider's sampler decides which requests are traced.
        control: the trace settings (level, rate, count) deciding first; None: the sampler alone.
    """

    def __init__(self, tracer: Tracer, control: TraceControl | None = None) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._tracer = tracer
        self.control = control
        self._propagator = TraceContextTextMapPropagator()
        self.timelines: dict[tuple[str, str], BatchTimeline] = {}

    def observer(self, model: str, version: str) -> BatchTimeline:
        """The execution timeline of one version (its scheduler observer)."""
        found = self.timelines.get((model, version))
        if found is None:
            found = self.timelines[(model, version)] = BatchTimeline()
        return found

    def begin(
        self, transport: str, route: str, traceparent: str | None, model: str | None = None, path: str = ""
    ) -> RequestTrace | None:
        """Start the request span; None when the settings or the sampler leave it untraced.

        ``route`` names a gRPC span; an HTTP one is named by ``path``'s route template.
        """
        from opentelemetry.trace import SpanKind

        control = self.control
        if (
            control is not None
            and model is not None
            and not control.admit(model, _caller_sampled(traceparent))
        ):
            return None
        carrier = {"traceparent": traceparent} if traceparent else {}
        parent = self._propagator.extract(carrier)
        epoch_ns = time.time_ns()
        attributes: dict[str, str]
        if transport == "http":
            template = route_template(path)
            route = f"POST {template}"
            attributes = {"http.request.method": "POST", "http.route": template, "url.scheme": "http"}
        else:
            attributes = {"rpc.system": "grpc", "rpc.service": _GRPC_SERVICE}
        span = self._tracer.start_span(
            route, context=parent, kind=SpanKind.SERVER, start_time=epoch_ns, attributes=attributes
        )
        if not span.is_recording():
            return None
        return RequestTrace(span, time.monotonic(), epoch_ns, transport=transport)

    def end(
        self,
        trace: RequestTrace,
        model: str,
        version: str | None,
        outcome: str,
        request_id: str | None,
        status: int | str | None = None,
    ) -> None:
        """Add the phase spans and end the request span (``status``: the HTTP status or the
        gRPC code's name the request was answered with)."""
        from opentelemetry.trace import Status, StatusCode, set_span_in_context

        now = time.monotonic()
        root = trace.span
        root.set_attributes({"ortserve.model": model, "ortserve.outcome": outcome})
        if isinstance(status, int):
            root.set_attribute("http.response.status_code", status)
        elif isinstance(status, str) and status in _GRPC_CODES:
            root.set_attribute("rpc.grpc.status_code", _GRPC_CODES[status])
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

    The ratio becomes the trace settings' ``trace_rate`` (one request in round(1 / ratio)),
    which the trace setting APIs may change later; one log line says tracing is on, how often
    and where spans go.

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
    rate = rate_of_ratio(sampling_ratio)
    provider = tracer_provider(1.0, processor)  # the trace settings choose; callers' flags are kept
    control = TraceControl(True, rate, exporter)
    logger.info(
        "tracing on: 1 request in %d traced (and every request whose traceparent is sampled), "
        "spans exported to %s",
        rate,
        export_destination(exporter),
    )
    return Tracing(provider.get_tracer("ortserve"), control), provider


def export_destination(exporter: str) -> str:
    """Where ``exporter`` sends spans, as its OpenTelemetry settings say (for the start-up line)."""
    if exporter == "console":
        return "the console (stdout)"
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if not endpoint:
        base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318")
        endpoint = base.rstrip("/") + "/v1/traces"
    return f"OTLP/HTTP at {endpoint}"
