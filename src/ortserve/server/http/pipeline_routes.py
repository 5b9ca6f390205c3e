"""Pipelines' own REST routes: POST a JSON body to the pipeline, answer its JSON.

Decode nothing, hand the body to the Exchange, encode: the Exchange accounts for the request
like OIP inference (request metrics and latency, the steps' split (preprocess, model calls,
postprocess), trace spans, capture) and routes the wrapped model's calls by its policy (sticky
key from a header or the body); the answer names the version in ``X-Model-Version``.
"""

from __future__ import annotations

import logging

from ortserve.pipeline.runtime import PipelineVersion
from ortserve.repository.registry import ModelRegistry
from ortserve.server.exchange import STEP_PHASES, Exchange
from ortserve.server.http.answers import begun
from ortserve.server.http.app import HttpApp, RouteHandler
from ortserve.server.http.messages import HttpRequest, HttpResponse, json_response
from ortserve.server.http.openapi_routes import pipeline_operation

__all__ = ["STEP_PHASES", "register_pipeline_routes"]

logger = logging.getLogger(__name__)


def _handler(exchange: Exchange, name: str) -> RouteHandler:
    async def handle(request: HttpRequest) -> HttpResponse:
        scope = begun(exchange, request, name, None)  # the app finishes it (answer or error)
        served, body = await exchange.pipeline(scope, name, request.text_header, request.body)
        return json_response(200, body, [(b"x-model-version", served.encode())])

    return handle


def register_pipeline_routes(registry: ModelRegistry, app: HttpApp) -> list[str]:
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
                handler = _handler(app.exchange, entry.name)
                operation = pipeline_operation(entry.name, version.pipeline.pipeline.example())
                app.add_route("POST", version.route, handler, operation)
                routes.append(version.route)
                logger.info("pipeline %s serves POST %s", entry.name, version.route)
    return routes
