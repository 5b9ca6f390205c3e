"""Pipelines' own REST routes: POST a JSON body to the pipeline, answer its JSON, and account
for it like OIP inference: request metrics and latency, the steps' split (preprocess, model
calls, postprocess), trace spans, ``X-Request-ID`` echo and traffic capture. The wrapped
model's version follows its routing policy (sticky key from a header or the body) and the
answer names it in ``X-Model-Version``."""

from __future__ import annotations

import asyncio
import logging
import time

import orjson

from ortserve.errors import InternalError, ModelNotFound, OrtServeError
from ortserve.pipeline.runtime import ROUTED_VERSIONS, PipelineVersion, pipeline_model_name
from ortserve.repository.registry import ModelRegistry
from ortserve.routing.router import ModelRouter
from ortserve.routing.table import RoutingTable
from ortserve.server.http.app import HttpApp, RouteHandler
from ortserve.server.http.errors import error_response, internal_error_response
from ortserve.server.http.messages import HttpRequest, HttpResponse, json_response
from ortserve.server.http.openapi_routes import pipeline_operation
from ortserve.telemetry import RequestScope, Telemetry

__all__ = ["STEP_PHASES", "register_pipeline_routes"]

logger = logging.getLogger(__name__)

PIPELINE_SUFFIX = pipeline_model_name("")
STEP_PHASES = ("input", "infer", "output")
"""The pipeline's steps recorded as ``ortserve_compute_seconds`` phases of ``<model>.pipeline``:
parse + preprocess, the model calls (queueing included), postprocess + encoding."""


def _resolve(registry: ModelRegistry, name: str) -> PipelineVersion:
    """The pipeline serving ``name`` now: a reload swaps it, the route keeps working."""
    served = registry.resolve(name, None)
    if not isinstance(served, PipelineVersion):
        raise ModelNotFound(f"model {name!r} is not a pipeline")
    return served


def _steps(telemetry: Telemetry, scope: RequestScope, started: float, marks: list[float]) -> None:
    """Step timings into the pipeline version's compute histograms and its trace's spans."""
    ended = time.monotonic()
    if len(marks) != 2 or scope.version is None:
        return
    if scope.trace is not None:
        scope.trace.decoded, scope.trace.inferred = marks
    metrics = telemetry.recorder(scope.model, scope.version, answered=True).metrics
    if metrics is not None:
        for phase, seconds in zip(STEP_PHASES, (marks[0] - started, marks[1] - marks[0], ended - marks[1])):
            metrics.compute[phase].observe(seconds)


def _handler(
    registry: ModelRegistry, app: HttpApp, telemetry: Telemetry, name: str, routing: RoutingTable | None
) -> RouteHandler:
    model = name.removesuffix(PIPELINE_SUFFIX)

    async def handle(request: HttpRequest) -> HttpResponse:
        arrival = (time.time(), time.monotonic())
        scope = telemetry.begin(
            "http", name, None, request.header(b"x-request-id"), request.header(b"traceparent")
        )
        marks: list[float] = []
        error: OrtServeError | None = None
        served = None
        try:
            version = _resolve(registry, name)
            scope.version = served = version.info.version
            router = routing.routers.get(model) if routing is not None else None
            if router is None:
                body = await version.handle_body(request.body, marks)
            else:
                served, body = await _routed(router, model, version, request, marks)
            response = json_response(200, body, [(b"x-model-version", served.encode())])
        except OrtServeError as failure:
            error, response = failure, error_response(failure)
        except Exception as exc:
            with scope.bound():
                error, response = InternalError("internal server error"), internal_error_response(exc)
        _steps(telemetry, scope, arrival[1], marks)
        scope.finish(error, response.status)
        request_id = scope.echoed_id()
        if request_id is not None:
            response.headers.append((b"x-request-id", request_id))
        if app.capture is not None and app.capture.sampled():
            app.capture.offer_http(
                request.path, name, scope.version, request.headers, request.body, arrival, response.status
            )
        return response

    return handle


async def _routed(
    router: ModelRouter, model: str, version: PipelineVersion, request: HttpRequest, marks: list[float]
) -> tuple[str, bytes]:
    """Run the pipeline with its model's calls pinned to the version the policy picks."""
    fields, body = _fields(router, request.body)
    _, choice = router.choose(router.view_of(None, {}, request.text_header, fields))
    token = ROUTED_VERSIONS.set({model: choice.version})
    done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    router.record(choice.version, choice.reason, done)
    try:
        answer = await version.handle_body(body, marks)
    except asyncio.CancelledError:
        done.cancel()
        raise
    except Exception as exc:
        done.set_exception(exc)
        done.exception()  # retrieved: the route answers it
        raise
    finally:
        ROUTED_VERSIONS.reset(token)
    done.set_result(None)
    return choice.version, answer


def _fields(router: ModelRouter, body: bytes) -> tuple[dict[str, object] | None, bytes]:
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


def register_pipeline_routes(
    registry: ModelRegistry, app: HttpApp, telemetry: Telemetry, routing: RoutingTable | None = None
) -> list[str]:
    """Add ``POST <route>`` for every loaded pipeline that declares one; returns the new routes.

    Called again after every model change: routes already there are kept. Errors become their
    statuses here (400 names the field), so they are counted too.
    """
    routes = []
    for entry in registry.entries():
        for version in entry.versions.values():
            if (
                isinstance(version, PipelineVersion)
                and version.route is not None
                and not app.has_route("POST", version.route)
            ):
                handler = _handler(registry, app, telemetry, entry.name, routing)
                operation = pipeline_operation(entry.name, version.pipeline.pipeline.example())
                app.add_route("POST", version.route, handler, operation)
                routes.append(version.route)
                logger.info("pipeline %s serves POST %s", entry.name, version.route)
    return routes
