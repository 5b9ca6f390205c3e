"""A worker's side of ``--workers N``: the routes that must see every worker go to the supervisor.

Metrics, statistics and the repository API answered by one worker would show (or change) that
worker alone. In a worker, these routes hand the request to the supervisor, which asks every
worker and merges; a request that carries the launch's token comes from the supervisor
itself and is answered with the worker's own view, by the route the server built.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import orjson

from ortserve.errors import OrtServeError
from ortserve.server.http.app import HttpApp, RouteHandler, SectionHandler
from ortserve.server.http.errors import error_response
from ortserve.server.http.messages import (
    HttpRequest,
    HttpResponse,
    RouteResult,
    json_response,
    resolve_response,
)
from ortserve.server.http.repository_routes import REPOSITORY_ROUTES
from ortserve.statistics import ServerStatistics, encode_statistics
from ortserve.supervisor.channel import ChannelError, request
from ortserve.supervisor.plan import TOKEN_HEADER, WorkerLaunch

__all__ = ["hand_over"]

_Local = Callable[[HttpRequest], RouteResult]


def hand_over(app: HttpApp, statistics: ServerStatistics, launch: WorkerLaunch) -> None:
    """Make ``app``'s metrics, statistics and repository routes go through the supervisor."""
    link = _Link(launch)
    metrics = app.route("GET", "/metrics")
    if metrics is not None:
        app.add_route("GET", "/metrics", link.route(metrics))

    def all_statistics(request: HttpRequest) -> HttpResponse:
        return json_response(200, encode_statistics(statistics.snapshot()))

    def model_statistics(request: HttpRequest, name: str, version: str | None) -> RouteResult:
        if request.method != "GET":
            return json_response(405, b'{"error":"method not allowed"}', [(b"allow", b"GET")])
        return json_response(200, encode_statistics(statistics.snapshot(name, version)))

    app.add_route("GET", "/v2/models/stats", link.route(all_statistics))
    app.add_model_route("GET", "stats", link.model_route(model_statistics))
    repository = app.section("repository")
    if repository is not None:
        app.add_section("repository", link.section(repository), REPOSITORY_ROUTES)


class _Link:
    def __init__(self, launch: WorkerLaunch) -> None:
        self._socket = launch.supervisor_socket
        self._token = launch.token

    def _mine(self, request: HttpRequest) -> bool:
        return request.header(TOKEN_HEADER) == self._token

    def route(self, local: _Local) -> RouteHandler:
        async def handler(request: HttpRequest) -> HttpResponse:
            if self._mine(request):
                return await resolve_response(local(request))
            return await self._forward(request)

        return handler

    def model_route(
        self, local: Callable[[HttpRequest, str, str | None], RouteResult]
    ) -> Callable[[HttpRequest, str, str | None], Coroutine[Any, Any, HttpResponse]]:
        async def handler(request: HttpRequest, name: str, version: str | None) -> HttpResponse:
            if self._mine(request):
                try:
                    return await resolve_response(local(request, name, version))
                except OrtServeError as error:
                    return error_response(error)
            return await self._forward(request)

        return handler

    def section(self, local: SectionHandler) -> SectionHandler:
        def handler(
            request: HttpRequest, parts: list[str]
        ) -> HttpResponse | Coroutine[Any, Any, HttpResponse]:
            if self._mine(request):
                return local(request, parts)
            return self._forward(request)

        return handler

    async def _forward(self, incoming: HttpRequest) -> HttpResponse:
        target = incoming.path + (f"?{incoming.query}" if incoming.query else "")
        try:
            answer = await request(
                self._socket, incoming.method, target, incoming.body, incoming.headers, timeout_s=660.0
            )
        except ChannelError:
            body = orjson.dumps({"error": "the supervisor did not answer; retry"})
            return json_response(503, body, [(b"retry-after", b"1")])
        return HttpResponse(answer.status, [answer.body], answer.content_type)
