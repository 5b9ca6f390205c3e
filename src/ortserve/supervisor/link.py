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

from ortserve.errors import (
    InternalError,
    InvalidInput,
    ModelControlDisabled,
    ModelNotFound,
    NotImplementedByServer,
    OrtServeError,
    PermissionDenied,
)
from ortserve.repository.index import IndexRow
from ortserve.repository.manager import LifecycleManager
from ortserve.server.grpc.service import StatisticsView
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
from ortserve.server.model_control import ModelControl
from ortserve.server.restriction import parse_restriction
from ortserve.statistics import (
    BatchSizeSnapshot,
    Duration,
    ServerStatistics,
    StatisticsSnapshot,
    encode_statistics,
)
from ortserve.supervisor.channel import ChannelError, request
from ortserve.supervisor.plan import TOKEN_HEADER, WorkerLaunch

__all__ = ["SupervisedControl", "hand_over", "statistics_view"]

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


_ERRORS: dict[int, type[OrtServeError]] = {
    400: InvalidInput,
    403: PermissionDenied,
    404: ModelNotFound,
    501: NotImplementedByServer,
    503: ModelControlDisabled,
}


class SupervisedControl(ModelControl):
    """Model control for gRPC in a worker: index, load and unload go through the supervisor,
    like the HTTP routes (the gRPC handler has already checked its own restriction, so the
    HTTP one is added to the call the supervisor passes on)."""

    def __init__(self, manager: LifecycleManager, launch: WorkerLaunch) -> None:
        super().__init__(manager, launch.settings.model_control_mode)
        self._socket = launch.supervisor_socket
        self._headers: dict[bytes, bytes] = {}
        if launch.settings.http_restricted_api:
            guard = parse_restriction(launch.settings.http_restricted_api).get("model-repository")
            if guard is not None:
                self._headers[guard.key.encode()] = guard.value.encode()

    async def index_view(self, ready_only: bool) -> list[IndexRow]:
        answer = await self._call("/v2/repository/index", {"ready": ready_only})
        return [IndexRow(r["name"], r["version"], r["state"], r["reason"]) for r in orjson.loads(answer)]

    async def load(self, name: str, config_json: str | None) -> None:
        parameters = {} if config_json is None else {"config": config_json}
        await self._call(f"/v2/repository/models/{name}/load", {"parameters": parameters})

    async def unload(self, name: str, dependents: bool) -> None:
        body = {"parameters": {"unload_dependents": dependents}}
        await self._call(f"/v2/repository/models/{name}/unload", body)

    async def _call(self, path: str, body: dict[str, Any]) -> bytes:
        try:
            answer = await request(
                self._socket, "POST", path, orjson.dumps(body), self._headers, timeout_s=660.0
            )
        except ChannelError:
            raise ModelControlDisabled("the supervisor did not answer; retry") from None
        if answer.status != 200:
            message = orjson.loads(answer.body or b"{}").get("error", f"status {answer.status}")
            raise _ERRORS.get(answer.status, InternalError)(message)
        return answer.body


def statistics_view(launch: WorkerLaunch) -> StatisticsView:
    """Every worker's statistics, merged by the supervisor, for the gRPC statistics call."""

    async def view(name: str | None, version: str | None) -> list[StatisticsSnapshot]:
        path = "/v2/models/stats" if name is None else f"/v2/models/{name}/stats"
        if name is not None and version is not None:
            path = f"/v2/models/{name}/versions/{version}/stats"
        try:
            answer = await request(launch.supervisor_socket, "GET", path, timeout_s=30.0)
        except ChannelError:
            raise ModelControlDisabled("the supervisor did not answer; retry") from None
        if answer.status != 200:
            message = orjson.loads(answer.body or b"{}").get("error", f"status {answer.status}")
            raise _ERRORS.get(answer.status, InternalError)(message)
        return [_snapshot(entry) for entry in orjson.loads(answer.body)["model_stats"]]

    return view


def _duration(entry: dict[str, Any]) -> Duration:
    return Duration(int(entry["count"]), int(entry["ns"]))


def _snapshot(entry: dict[str, Any]) -> StatisticsSnapshot:
    stats = entry["inference_stats"]
    return StatisticsSnapshot(
        entry["name"],
        entry["version"],
        int(entry["last_inference"]),
        int(entry["inference_count"]),
        int(entry["execution_count"]),
        _duration(stats["success"]),
        _duration(stats["fail"]),
        _duration(stats["queue"]),
        _duration(stats["compute_input"]),
        _duration(stats["compute_infer"]),
        _duration(stats["compute_output"]),
        tuple(
            BatchSizeSnapshot(
                int(b["batch_size"]),
                _duration(b["compute_input"]),
                _duration(b["compute_infer"]),
                _duration(b["compute_output"]),
            )
            for b in entry.get("batch_stats", [])
        ),
    )
