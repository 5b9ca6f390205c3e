"""The one request edge: every request kind reaches a model through an :class:`Exchange`.

OIP inference over HTTP and gRPC, the pipelines' REST routes and the LLM routes (OpenAI chat
and completions, the generate extension) are four decoders in front of one object, built once
by the server and handed to both transports. It knows no ``HttpResponse`` and no gRPC call: it
takes plain values (model, version, request id, traceparent, a header getter, the body) and
does, for every kind alike:

- identification: the request scope (request id, trace span) and the capture sample;
- routing: a model's traffic policy picks the version (split, sticky key, override, shadow,
  rollout), ONNX, pipeline and LLM models alike;
- admission and refusal: the scheduler's or the generation engine's own;
- telemetry: ``ortserve_requests_total`` and the latency histograms under the same labels,
  the access log line, the span;
- capture: the sampled request offered once it is answered;
- error settling: :func:`~ortserve.server.deferred.settle`.

A transport keeps decode -> exchange -> encode, and maps the settled error to its wire in one
function. The OIP path costs what it did: no task per request (the transports wrap the
submitted future in one :class:`~ortserve.server.deferred.Deferred`), and a request that is
not sampled pays one ``None`` check for capture.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import ParamSpec, Protocol, TypeVar

import orjson

from ortserve.capture import Capture
from ortserve.core.dataplane import DataPlane
from ortserve.core.types import InferRequest, InferResponse
from ortserve.errors import ModelNotFound, OrtServeError
from ortserve.llm.servable import GenerationStream, LlmVersion
from ortserve.pipeline.runtime import ROUTED_VERSIONS, PipelineVersion, pipeline_model_name
from ortserve.routing.router import ModelRouter
from ortserve.server.deferred import Deferred, attempt, settle
from ortserve.server.llm_shadow import mirror_generation
from ortserve.telemetry import RequestScope, Telemetry
from ortserve.tenancy.gate import TenantGate

__all__ = ["CLIENT_CLOSED", "STEP_PHASES", "Deferred", "Exchange", "settle"]

_P = ParamSpec("_P")
_R = TypeVar("_R")
_T = TypeVar("_T")


class _Begin(Protocol):
    """Opens one request's scope (end it with ``Exchange.finish``, or the stream's close)."""

    def __call__(
        self,
        transport: str,
        model: str,
        version: str | None,
        request_id: str | None,
        traceparent: str | None,
        path: str = "",
        header: Callable[[str], str | None] | None = None,
        body: bytes = b"",
    ) -> RequestScope: ...


_Finish = Callable[[RequestScope, OrtServeError | None, int | str], None]
"""Accounts for an answered request (metrics, access log, span, capture) and settles what its
router waits for."""

Headers = Callable[[str], str | None]
"""A request's header (gRPC: metadata) by lower-case name."""

CLIENT_CLOSED = 499
"""The access log's status of a streamed answer the client left before its end (nginx's)."""

STEP_PHASES = ("input", "infer", "output")
"""A pipeline's steps as ``ortserve_compute_seconds`` phases of ``<model>.pipeline``: parse +
preprocess, the model calls (queueing included), postprocess + encoding."""

_PIPELINE_SUFFIX = pipeline_model_name("")


def _no_headers(name: str) -> str | None:
    return None


class Exchange:
    """Where every request meets the server: one per server, shared by HTTP and gRPC.

    Args:
        dataplane: the models (resolution, the OIP submit path, shared memory).
        telemetry: request accounting (metrics, statistics, access log, traces).
        capture: the traffic capture (``--capture-dir``), or None.
        routers: the models' traffic policies by name (the routing table's dict, read live).
    """

    def __init__(
        self,
        dataplane: DataPlane,
        telemetry: Telemetry,
        capture: Capture | None = None,
        routers: Mapping[str, ModelRouter] | None = None,
        gate: TenantGate | None = None,
    ) -> None:
        self.dataplane = dataplane
        self.gate = gate
        """API keys and per-tenant quotas (None: off, one check per request)."""
        self.telemetry = telemetry
        self.capture = capture
        self.routers: Mapping[str, ModelRouter] = routers if routers is not None else {}
        # Without capture, opening and finishing a scope is all there is to do: the transports
        # call the scope's own methods, and the per-request path costs no call more than it
        # did before the Exchange (benchmarks/RESULTS.md, "One request edge").
        self.begin: _Begin = telemetry.begin if capture is None else self._begin_sampled
        self.finish: _Finish = RequestScope.finish if capture is None else self._finish_sampled

    @property
    def records_each_request(self) -> bool:
        """Tracing, the access log or capture is on: every request wants its own record, so
        the transports' cheap edge refusals (no scope) are skipped."""
        telemetry = self.telemetry
        return self.capture is not None or telemetry.tracing is not None or telemetry.access_log

    # -- identification ------------------------------------------------------------------

    def _begin_sampled(
        self,
        transport: str,
        model: str,
        version: str | None,
        request_id: str | None,
        traceparent: str | None,
        path: str = "",
        header: Headers | None = None,
        body: bytes = b"",
    ) -> RequestScope:
        """``begin`` with capture on: the scope, and its capture sample when it is sampled.

        ``path``, ``header`` and ``body`` are what a capture record keeps of an HTTP request
        (a gRPC call's record is made from its decoded request, see :meth:`submit`).
        """
        scope = self.telemetry.begin(transport, model, version, request_id, traceparent, path)
        capture = self.capture
        if capture is not None:
            scope.sample = capture.sample(path, header, body)
        return scope

    def _finish_sampled(self, scope: RequestScope, error: OrtServeError | None, status: int | str) -> None:
        """``finish`` with capture on: the scope's accounting, then its capture sample."""
        scope.finish(error, status)
        sample = scope.sample
        # A gRPC call that could not be decoded has no HTTP form: it is not recorded.
        if sample is not None and self.capture is not None and (sample.path or sample.request is not None):
            http_status = status if isinstance(status, int) else (200 if error is None else error.http_status)
            self.capture.offer_sample(sample, scope.model, scope.version, http_status)

    @staticmethod
    def abandon(scope: RequestScope) -> None:
        """The client went away before an answer: only the in-flight count changes."""
        scope.abandon()

    def settle(self, scope: RequestScope, exc: BaseException) -> OrtServeError:
        """What the client is told about ``exc`` (unexpected ones logged with the scope bound)."""
        return settle(exc, scope)

    def failed(self, scope: RequestScope, exc: BaseException) -> OrtServeError:
        """Settle ``exc`` and finish the request's scope with it (the status of its
        transport's wire); returns what the client is told."""
        error = settle(exc, scope)
        self.finish(scope, error, error.grpc_code if scope.transport == "grpc" else error.http_status)
        return error

    def attempt(
        self, scope: RequestScope, call: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs
    ) -> _R | OrtServeError:
        """``call(*args)``'s result, or, when it raised, the settled error with the request's
        scope finished (:meth:`failed`): for a transport that answers an error as a value (a
        stream's per-request error message)."""
        result = attempt(call, *args, **kwargs)
        return self.failed(scope, result) if isinstance(result, Exception) else result

    # -- OIP inference ---------------------------------------------------------------------

    # -- tenancy ------------------------------------------------------------------------------

    def admit(self, headers: Headers, generation: bool = False) -> str:
        """The request's tenant, by its API key or tenant header, once its quota let it in:
        called by every transport for every request kind before the body is decoded (only
        when ``gate`` is set: tenancy off costs one attribute check). A ``generation`` (an
        LLM request) is also refused while its tenant owes tokens (:meth:`charge`).

        Raises:
            Unauthenticated: API keys are on and the request has no valid one (401,
                UNAUTHENTICATED).
            Overloaded: the tenant's request (or token) quota is spent (429 with Retry-After,
                RESOURCE_EXHAUSTED).
        """
        assert self.gate is not None
        return self.gate.admit(headers, generation)

    def charge(self, tenant: str | None, streams: Sequence[GenerationStream]) -> None:
        """An LLM request's tokens (prompt and generated) go to its tenant's token quota once
        its answer is complete; a tenant in debt is refused its next generation
        (:meth:`admit`) until its bucket refills."""
        gate = self.gate
        if gate is not None and gate.quotas is not None and tenant is not None and streams:
            used = streams[0].prompt_tokens + sum(s.completion_tokens for s in streams)
            gate.quotas.charge_tokens(tenant, used)

    def submit(
        self, scope: RequestScope, request: InferRequest, headers: Headers, tenant: str | None = None
    ) -> asyncio.Future[InferResponse]:
        """Queue a decoded OIP request (routed when its model has a policy); ``tenant`` is the
        one :meth:`admit` named (the scheduler shares a model's queue fairly by tenant).

        Raises:
            ModelNotFound, ModelNotReady, InvalidInput, Overloaded; the future may fail with
            DeadlineExceeded, ModelNotReady or InferenceError.
        """
        # RequestScope.identify, inlined (once per request: the OIP path makes no call more than
        # before the Exchange): the OIP ``id`` wins over the header, and the answer carries it.
        if request.id:
            scope.request_id = request.id
        elif scope.request_id is not None:
            request.id = scope.request_id
        if scope.trace is not None:
            scope.trace.decoded = time.monotonic()
        request.headers = headers
        request.tenant = tenant
        sample = scope.sample
        if sample is not None and not sample.body:  # a gRPC call: recorded in its HTTP form
            sample.request = request
        pending = self.dataplane.submit(request)
        scope.pending = pending
        return pending

    # -- generation --------------------------------------------------------------------------

    def llm(
        self,
        scope: RequestScope,
        name: str,
        version: str | None,
        headers: Headers | None,
        fields: Mapping[str, object] | None = None,
        tenant: str | None = None,
    ) -> LlmVersion:
        """The LLM version that serves this request, through the model's policy when it has
        one (split, sticky key, override from a header or the body's fields, rollout).
        ``tenant``: the one :meth:`admit` named; None with tenancy on admits it here.

        Raises:
            ModelNotFound: no such model, or not a generation model. ModelNotReady, InvalidInput.
            Unauthenticated, Overloaded: see :meth:`admit`.
        """
        if tenant is None and self.gate is not None:
            self.gate.admit(headers or _no_headers, generation=True)
        router = self.routers.get(name)
        if router is None:
            served = self.dataplane.resolve(name, version)
        else:
            served, choice = router.choose(router.view_of(version, {}, headers, fields))
            scope.routed = asyncio.get_running_loop().create_future()
            router.record(choice.version, choice.reason, scope.routed)
        if not isinstance(served, LlmVersion):
            raise ModelNotFound(f"model {name!r} is not a text-generation model (kind: llm)")
        scope.version = served.info.version
        return served

    def started(
        self, scope: RequestScope, tenant: str | None, llm: LlmVersion, streams: Sequence[GenerationStream]
    ) -> None:
        """A generation just started: the model's policy may copy it to its shadow version
        (see :mod:`~ortserve.server.llm_shadow`; its agreement is reported by the routing GET),
        and its tokens go to ``tenant``'s token quota once the request's scope finishes (its
        answer whole, its stream ended, or the client gone)."""
        router = self.routers.get(scope.model)
        if router is not None and scope.routed is not None and router.policy.config.shadow is not None:
            mirror_generation(router, scope.routed, llm, streams[0])
        gate = self.gate
        if tenant is not None and gate is not None and gate.quotas is not None:
            if scope.routed is None:
                scope.routed = asyncio.get_running_loop().create_future()
            scope.routed.add_done_callback(lambda _: self.charge(tenant, streams))

    async def stream(
        self,
        scope: RequestScope,
        events: AsyncIterator[_T],
        error_event: Callable[[OrtServeError], _T],
    ) -> AsyncIterator[_T]:
        """A streamed answer: ``events`` (an HTTP body's pieces, a gRPC stream's messages),
        then the scope finishes when the stream ends, fails (one last ``error_event``: the
        head is already out), or the client leaves (the connection closes this iterator, or
        the call's task is cancelled; the generation is cancelled)."""
        grpc = scope.transport == "grpc"
        error: OrtServeError | None = None
        status: int | str = "OK" if grpc else 200
        try:
            async for piece in events:
                yield piece
        except (GeneratorExit, asyncio.CancelledError):
            status = "CANCELLED" if grpc else CLIENT_CLOSED
            raise
        except Exception as exc:
            error = settle(exc, scope)
            status = error.grpc_code if grpc else error.http_status
            yield error_event(error)
        finally:
            with contextlib.suppress(Exception):
                await events.aclose()  # type: ignore[attr-defined]
            if scope.trace is not None:
                scope.inferred(scope.version or "")
            self.finish(scope, error, status)

    # -- pipelines -----------------------------------------------------------------------------

    async def pipeline(
        self, scope: RequestScope, name: str, headers: Headers, body: bytes
    ) -> tuple[str, bytes]:
        """Run a pipeline's REST request; returns the version of its model that answered and
        the JSON answer. Its model calls follow the model's policy (sticky key from a header
        or the body's top-level fields, stripped before the pipeline sees them).

        Raises:
            ModelNotFound: not a pipeline; whatever the pipeline raises.
        """
        started = time.monotonic()
        served = self.dataplane.resolve(name, None)
        if not isinstance(served, PipelineVersion):
            raise ModelNotFound(f"model {name!r} is not a pipeline")
        scope.version = version = served.info.version
        model = name.removesuffix(_PIPELINE_SUFFIX)
        router = self.routers.get(model)
        marks: list[float] = []
        try:
            if router is None:
                return version, await served.handle_body(body, marks)
            fields, body = _routing_fields(router, body)
            _, choice = router.choose(router.view_of(None, {}, headers, fields))
            scope.routed = asyncio.get_running_loop().create_future()
            router.record(choice.version, choice.reason, scope.routed)
            token = ROUTED_VERSIONS.set({model: choice.version})
            try:
                return choice.version, await served.handle_body(body, marks)
            finally:
                ROUTED_VERSIONS.reset(token)
        finally:
            self._steps(scope, started, marks)

    def _steps(self, scope: RequestScope, started: float, marks: list[float]) -> None:
        """Step timings into the pipeline version's compute histograms and its trace's spans."""
        ended = time.monotonic()
        if len(marks) != 2 or scope.version is None:
            return
        if scope.trace is not None:
            scope.trace.decoded, scope.trace.inferred = marks
        metrics = self.telemetry.recorder(scope.model, scope.version, answered=True).metrics
        if metrics is not None:
            for phase, seconds in zip(
                STEP_PHASES, (marks[0] - started, marks[1] - marks[0], ended - marks[1]), strict=True
            ):
                metrics.compute[phase].observe(seconds)


def _routing_fields(router: ModelRouter, body: bytes) -> tuple[dict[str, object] | None, bytes]:
    """The body's top-level fields, parsed only when it may hold the override parameter or the
    sticky field, and the body without them: they are routing's, not the pipeline's."""
    config = router.policy.config
    names = [
        n for n in (config.override and config.override.parameter, config.sticky and config.sticky.field) if n
    ]
    if not any(f'"{n}"'.encode() in body for n in names):
        return None, body
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None, body  # the pipeline's own parsing answers 400
    if not isinstance(document, dict) or not any(n in document for n in names):
        return None, body
    rest = {k: v for k, v in document.items() if k not in names}
    return document, orjson.dumps(rest)
