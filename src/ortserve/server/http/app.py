"""Open Inference Protocol routes over HTTP: decode, call the DataPlane, encode."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

import orjson

from ortserve.core.dataplane import DataPlane
from ortserve.core.types import InferResponse
from ortserve.errors import InvalidInput, ModelNotFound
from ortserve.protocol.http_codec import (
    decode_infer_request,
    encode_infer_response,
    encode_model_metadata,
    encode_server_metadata,
)
from ortserve.protocol.tensors import TensorLimits
from ortserve.server.exchange import Exchange
from ortserve.server.http.answers import answered, failed, failure, settled
from ortserve.server.http.encoding import answer_coding, compress_answer, inflate_then_route
from ortserve.server.http.errors import error_response
from ortserve.server.http.messages import (
    Deferred,
    HttpRequest,
    HttpResponse,
    RouteResult,
    json_response,
)
from ortserve.server.http.methods import answer_methods, method_not_allowed
from ortserve.statistics import ServerStatistics, encode_statistics
from ortserve.telemetry import RequestScope, Telemetry

__all__ = ["BUILTIN_ROUTES", "HttpApp", "ModelRouteHandler", "Operation", "RouteHandler", "SectionHandler"]

RouteHandler = Callable[[HttpRequest], Coroutine[Any, Any, HttpResponse]]
SectionHandler = Callable[[HttpRequest, list[str]], HttpResponse | Coroutine[Any, Any, HttpResponse]]
ModelRouteHandler = Callable[[HttpRequest, str, str | None], "RouteResult"]
Operation = dict[str, Any]
"""An OpenAPI operation object describing a route added to the app."""

# Every (method, path template) that _route serves itself. tests/server/test_openapi.py checks
# that each is served and described in openapi.yaml: a route added to _route belongs here.
BUILTIN_ROUTES = (
    ("GET", "/v2"),
    ("GET", "/v2/health/live"),
    ("GET", "/v2/health/ready"),
    ("GET", "/v2/models/stats"),
    ("GET", "/v2/models/{model}"),
    ("GET", "/v2/models/{model}/versions/{version}"),
    ("GET", "/v2/models/{model}/ready"),
    ("GET", "/v2/models/{model}/versions/{version}/ready"),
    ("POST", "/v2/models/{model}/infer"),
    ("POST", "/v2/models/{model}/versions/{version}/infer"),
    ("GET", "/v2/models/{model}/stats"),
    ("GET", "/v2/models/{model}/versions/{version}/stats"),
)

# KServe's v2 bodies ($live_server_response, $ready_server_response): its clients parse them;
# Triton's read only the status. Built per call: a response may be changed on its way out.
_LIVE = {True: b'{"live":true}', False: b'{"live":false}'}
_READY = {True: b'{"ready":true}', False: b'{"ready":false}'}
_HEADER_LENGTH = b"inference-header-content-length"
_DECODE_OFF_LOOP = 1 << 20
"""JSON documents larger than this are parsed on a worker thread (see ``_infer_decoded_off_loop``)."""
_OCTET_STREAM = b"application/octet-stream"


class HttpApp:
    """Routes requests; infer and domain routes return coroutines, the rest answer at once.

    Args:
        dataplane: the server's one DataPlane.
        limits: tensor limits applied while decoding.
        telemetry: request accounting and the statistics extension's totals.
        exchange: the server's one request edge (shared with gRPC); by default one over
            ``dataplane`` and ``telemetry`` without capture or routing.
    """

    def __init__(
        self,
        dataplane: DataPlane,
        limits: TensorLimits,
        telemetry: Telemetry | None = None,
        max_body_bytes: int = 64 * 1024 * 1024,
        exchange: Exchange | None = None,
    ) -> None:
        self._dataplane = dataplane
        self._max_body_bytes = max_body_bytes
        self._limits = limits
        if exchange is None:
            exchange = Exchange(dataplane, telemetry or Telemetry(ServerStatistics()))
        self.exchange = exchange
        self._telemetry = exchange.telemetry
        self._extra: dict[tuple[str, str], RouteHandler] = {}
        self._extra_paths: dict[str, list[str]] = {}
        self._sections: dict[str, SectionHandler] = {}
        self._added: dict[tuple[str, str], Operation | None] = {}
        self._model_routes: dict[str, ModelRouteHandler] = {}

    def add_route(
        self, method: str, path: str, handler: RouteHandler, operation: Operation | None = None
    ) -> None:
        """Add a fixed-path route (pipelines' REST routes, metrics).

        ``operation`` describes it in /openapi.json when openapi.yaml does not already.
        """
        self._extra[(method, path)] = handler
        methods = self._extra_paths.setdefault(path, [])
        if method not in methods:  # a route replaced (the workers of --workers N forward some)
            methods.append(method)
        self._added[(method, path)] = operation

    def has_route(self, method: str, path: str) -> bool:
        return (method, path) in self._extra

    def route(self, method: str, path: str) -> RouteHandler | None:
        """The handler added for ``method path``, so a wrapper can replace it and still call it."""
        return self._extra.get((method, path))

    def add_section(self, name: str, handler: SectionHandler, routes: tuple[tuple[str, str], ...]) -> None:
        """Hand every ``/v2/<name>/...`` path to ``handler`` with the segments after ``name``.

        ``routes`` are the (method, path template) pairs the handler serves.
        """
        self._sections[name] = handler
        self._added.update(dict.fromkeys(routes))

    def section(self, name: str) -> SectionHandler | None:
        """The handler of ``/v2/<name>/...``, so a wrapper can replace it and still call it."""
        return self._sections.get(name)

    def routes(self) -> dict[tuple[str, str], Operation | None]:
        """Every (method, path template) served, with the operation given when it was added."""
        return {**dict.fromkeys(BUILTIN_ROUTES), **self._added}

    def add_model_route(
        self,
        method: str,
        last: str,
        handler: ModelRouteHandler,
        operation: Callable[[str], Operation] | None = None,
    ) -> None:
        """Hand ``/v2/models/<m>[/versions/<v>]/<last>`` to ``handler`` with the model and version.

        ``operation`` describes the route given its path template, for /openapi.json.
        """
        self._model_routes[last] = handler
        for template in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            path = f"{template}/{last}"
            self._added[(method, path)] = None if operation is None else operation(path)

    def model_route(self, last: str) -> ModelRouteHandler | None:
        """The handler added for ``/v2/models/<m>/<last>``, so a wrapper can replace it and still call it."""
        return self._model_routes.get(last)

    def __call__(self, request: HttpRequest) -> RouteResult:
        """The answer to ``request``: the one place a route's exception becomes an HTTP answer
        (:func:`~ortserve.server.http.answers.failure`, the request's scope finished with it);
        a coroutine route's in :func:`~ortserve.server.http.answers.settled`."""
        try:
            return answer_methods(request, self._coded)
        except Exception as exc:
            return failure(self.exchange, request, exc)

    def _coded(self, request: HttpRequest) -> RouteResult:
        """Route with the body's Content-Encoding undone and the answer's Accept-Encoding applied."""
        coding = request.headers.get(b"content-encoding")
        if coding is None or (coding := coding.strip().lower()) == b"identity":
            result = self._route(request)
        else:
            result = inflate_then_route(request, coding, self._max_body_bytes, self._route)
            if not isinstance(result, (HttpResponse, Deferred)):
                result = settled(self.exchange, request, result)  # inflated in a thread
        reply_coding = answer_coding(request)  # infer answers only, as Triton (encoding.py says why)
        return result if reply_coding is None else compress_answer(result, reply_coding)

    def _route(self, request: HttpRequest) -> RouteResult:
        path = request.path
        extra = self._extra.get((request.method, path))
        if extra is not None:
            return settled(self.exchange, request, extra(request))
        if path in self._extra_paths:
            return method_not_allowed(*self._extra_paths[path])
        parts = path.strip("/").split("/")
        if not parts or parts[0] != "v2":
            return _not_found(path)
        rest = parts[1:]
        if not rest:
            return self._get(request, lambda: encode_server_metadata(self._dataplane.server_metadata()))
        if rest[0] == "health" and len(rest) == 2:
            return self._health(request, rest[1])
        if rest == ["models", "stats"]:
            return self._get(request, lambda: encode_statistics(self._telemetry.statistics.snapshot()))
        if rest[0] == "models" and len(rest) >= 2:
            return self._model_route(request, rest[1:])
        section = self._sections.get(rest[0])
        if section is not None:
            result = section(request, rest[1:])
            return result if isinstance(result, HttpResponse) else settled(self.exchange, request, result)
        return _not_found(path)

    def _health(self, request: HttpRequest, which: str) -> HttpResponse:
        if request.method != "GET":
            return method_not_allowed("GET")
        if which == "live":
            return _health_response(_LIVE, self._dataplane.live())
        if which == "ready":
            return _health_response(_READY, self._dataplane.ready())
        return _not_found(request.path)

    def _model_route(self, request: HttpRequest, parts: list[str]) -> RouteResult:
        name, rest = parts[0], parts[1:]
        version: str | None = None
        if len(rest) >= 2 and rest[0] == "versions":
            version, rest = rest[1], rest[2:]
        if not name or version == "":
            return _not_found(request.path)
        if not rest:
            return self._get(
                request, lambda: encode_model_metadata(self._dataplane.model_metadata(name, version))
            )
        if rest == ["ready"]:
            if request.method != "GET":
                return method_not_allowed("GET")
            ready = self._dataplane.model_ready(name, version)  # $ready_model_response
            return json_response(200 if ready else 503, orjson.dumps({"name": name, "ready": ready}))
        if rest == ["infer"]:
            if request.method != "POST":
                return method_not_allowed("POST")
            return self._infer(request, name, version)
        handler = self._model_routes.get("/".join(rest))  # "config", "trace/setting"...
        if handler is not None:  # before the built-in stats, which a worker of --workers N replaces
            result = handler(request, name, version)
            if isinstance(result, (HttpResponse, Deferred)):
                return result
            return settled(self.exchange, request, result)
        if rest == ["stats"]:
            return self._get(
                request, lambda: encode_statistics(self._telemetry.statistics.snapshot(name, version))
            )
        return _not_found(request.path)

    @staticmethod
    def _get(request: HttpRequest, body: Callable[[], bytes]) -> HttpResponse:
        if request.method != "GET":
            return method_not_allowed("GET")
        return json_response(200, body())

    def _infer(
        self, request: HttpRequest, name: str, version: str | None
    ) -> HttpResponse | Deferred[HttpResponse] | Coroutine[Any, Any, HttpResponse]:
        exchange = self.exchange
        scope = exchange.begin(
            "http",
            name,
            version,
            request.header(b"x-request-id"),
            request.header(b"traceparent"),
            request.path,
            request.text_header,
            request.body,
        )
        request.scope = scope  # what raises below is answered by __call__, the scope finished
        if exchange.gate is not None:  # the tenant's key and quota, before any decoding
            request.tenant = exchange.admit(request.text_header)
        header_length = _header_length(request)
        if (len(request.body) if header_length is None else header_length) > _DECODE_OFF_LOOP:
            return settled(
                exchange, request, self._infer_decoded_off_loop(request, header_length, name, version)
            )
        infer_request = decode_infer_request(
            request.body, header_length, name, version, self._limits, self._dataplane.shared_memory
        )
        pending = exchange.submit(scope, infer_request, request.text_header, request.tenant)
        request.scope = None  # the deferred answer finishes it
        binary_default = infer_request.parameters.get("binary_data_output", False) is True
        return Deferred(
            pending,
            functools.partial(_infer_response, exchange, binary_default, scope),
            functools.partial(failed, exchange, scope),
        )

    async def _infer_decoded_off_loop(
        self,
        request: HttpRequest,
        header_length: int | None,
        name: str,
        version: str | None,
    ) -> HttpResponse:
        """A large JSON document is parsed on a worker thread: on the loop, 30 MB took 0.5 s
        (1.4 s when a NaN token sends it through the stdlib's parser), and every other
        connection waited. The loop gets the GIL back between the decoder's steps, not inside
        one: orjson's single call still holds it (a 30 MB body: /v2/health/live waited 0.41 s
        instead of 0.48 s; 0.74 s instead of 1.39 s through the stdlib). Binary tensors are
        the way to send large inputs."""
        infer_request = await asyncio.to_thread(
            decode_infer_request,
            request.body,
            header_length,
            name,
            version,
            self._limits,
            self._dataplane.shared_memory,
        )
        assert request.scope is not None
        pending = self.exchange.submit(request.scope, infer_request, request.text_header, request.tenant)
        try:
            await asyncio.wait((pending,))
        finally:
            pending.cancel()  # the client left first (settled() drops the scope); else done
        binary_default = infer_request.parameters.get("binary_data_output", False) is True
        return _encoded(request.scope, binary_default, pending)


def _infer_response(
    exchange: Exchange, binary_default: bool, scope: RequestScope, done: asyncio.Future[InferResponse]
) -> HttpResponse:
    """The deferred answer of an OIP request (the future's callback: no task per request).

    Raises:
        what the request failed with, or encoding its answer raised: the transport's guard
        answers it with the Deferred's ``failed`` (the scope finished with it).
    """
    return answered(exchange, scope, _encoded(scope, binary_default, done), None)


def _encoded(scope: RequestScope, binary_default: bool, done: asyncio.Future[InferResponse]) -> HttpResponse:
    """Raises: what the request failed with, or what encoding its answer raised."""
    response = done.result()
    scope.inferred(response.model_version)
    encoded = encode_infer_response(response, binary_default)
    status, headers = 200, []
    if response.degraded is not None:  # a fallback level answered (docs/resilience.md)
        status = response.degraded.http_status
        headers.append((b"x-ortserve-degraded", response.degraded.header.encode("ascii")))
    if encoded.header_length is None:
        return HttpResponse(status, encoded.chunks, headers=headers)
    headers.append((b"inference-header-content-length", str(encoded.header_length).encode()))
    return HttpResponse(status, encoded.chunks, _OCTET_STREAM, headers)


def _header_length(request: HttpRequest) -> int | None:
    raw = request.headers.get(_HEADER_LENGTH)
    if raw is None:
        return None
    digits = raw.strip()
    if not digits.isdigit() or len(digits) > 19:  # int() refuses over 4,300 digits: a 500
        raise InvalidInput("Inference-Header-Content-Length must be a non-negative integer")
    return int(digits)


def _health_response(bodies: dict[bool, bytes], healthy: bool) -> HttpResponse:
    return json_response(200 if healthy else 503, bodies[healthy])


def _not_found(path: str) -> HttpResponse:
    return error_response(ModelNotFound(f"no route for {path}"))
