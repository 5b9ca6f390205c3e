"""Pipelines' own REST routes: POST a JSON body to the pipeline, answer its JSON."""

from __future__ import annotations

import logging

from ortserve.pipeline.runtime import PipelineVersion
from ortserve.repository.registry import ModelRegistry
from ortserve.server.http.app import HttpApp, RouteHandler
from ortserve.server.http.messages import HttpRequest, HttpResponse, json_response

__all__ = ["register_pipeline_routes"]

logger = logging.getLogger(__name__)


def _handler(version: PipelineVersion) -> RouteHandler:
    async def handle(request: HttpRequest) -> HttpResponse:
        return json_response(200, await version.handle_body(request.body))

    return handle


def register_pipeline_routes(registry: ModelRegistry, app: HttpApp) -> list[str]:
    """Add ``POST <route>`` for every loaded pipeline that declares one; returns the routes.

    The HTTP app maps errors the handler raises to their statuses (400 names the field).
    """
    routes = []
    for entry in registry.entries():
        for version in entry.versions.values():
            if isinstance(version, PipelineVersion) and version.route is not None:
                app.add_route("POST", version.route, _handler(version))
                routes.append(version.route)
                logger.info("pipeline %s serves POST %s", entry.name, version.route)
    return routes
