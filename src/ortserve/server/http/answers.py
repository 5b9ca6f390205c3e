"""An HTTP request's end at the Exchange: the answer accounted for, its id echoed, and the one
place an exception becomes an HTTP answer.

Every HTTP route that reaches a model (OIP infer, pipelines, OpenAI, generate, responses,
tokenize, embeddings) opens its scope with :func:`begun`, which marks the request; the app
finishes it with whatever the route returns or raises (:func:`settled` for a coroutine, the
app's own call for a route that answers at once), so each is counted, access-logged, traced,
captured and echoes ``X-Request-ID`` alike, and a route holds no ``try`` of its own. An error's
body is the route family's :class:`~ortserve.server.http.messages.ErrorShape` (OIP
``{"error": ...}``, OpenAI's object), its status and ``Retry-After`` the same for all; a
streamed answer's scope finishes with the stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from ortserve.errors import OrtServeError
from ortserve.server.deferred import settle
from ortserve.server.exchange import Exchange
from ortserve.server.http.errors import OIP
from ortserve.server.http.messages import ErrorShape, HttpRequest, HttpResponse
from ortserve.telemetry import RequestScope

__all__ = ["answered", "begun", "failed", "failure", "settled", "success", "with_request_id"]


def begun(
    exchange: Exchange,
    request: HttpRequest,
    model: str,
    version: str | None,
    shape: ErrorShape = OIP,
    generation: bool = False,
) -> RequestScope:
    """The request's scope at the Exchange (its id, trace context, what capture keeps of an
    HTTP request), and its tenant admitted (a ``generation`` also by its token quota): the app
    finishes the scope with the route's answer.

    Raises:
        Unauthenticated, Overloaded: the tenant's key or quota (the app answers them, counted).
    """
    scope = exchange.begin(
        "http",
        model,
        version,
        request.header(b"x-request-id"),
        request.header(b"traceparent"),
        request.path,
        request.text_header,
        request.body,
    )
    request.scope = scope
    request.shape = shape
    if exchange.gate is not None:
        request.tenant = exchange.admit(request.text_header, generation)
    return scope


def answered(
    exchange: Exchange, scope: RequestScope, response: HttpResponse, error: OrtServeError | None
) -> HttpResponse:
    """Finish the request's scope with ``response`` and echo its id."""
    exchange.finish(scope, error, response.status)
    return with_request_id(scope, response)


def failed(
    exchange: Exchange, scope: RequestScope, exc: BaseException, shape: ErrorShape = OIP
) -> HttpResponse:
    """The answer to a request refused or failed: the settled error in ``shape``."""
    error = exchange.settle(scope, exc)
    return answered(exchange, scope, shape.response(error), error)


def failure(exchange: Exchange, request: HttpRequest, exc: BaseException) -> HttpResponse:
    """What ``request`` is answered when its route raised ``exc``: the settled error in the
    route's shape, its scope (when it reached the Exchange) finished with it."""
    shape = request.shape or OIP
    scope = request.scope
    if scope is None:
        return shape.response(settle(exc))
    request.scope = None
    return failed(exchange, scope, exc, shape)


def success(exchange: Exchange, request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """``response`` as the answer to ``request``: its scope finished now, or when its stream
    ends or the client leaves."""
    scope = request.scope
    if scope is None:
        return response
    request.scope = None
    if response.stream is None:
        return answered(exchange, scope, response, None)
    response.stream = exchange.stream(scope, response.stream, (request.shape or OIP).event)
    return with_request_id(scope, response)


async def settled(
    exchange: Exchange, request: HttpRequest, route: Coroutine[Any, Any, HttpResponse]
) -> HttpResponse:
    """A coroutine route's answer, its failure mapped by :func:`failure` (the one place an
    HTTP route's exception is caught); a client that leaves first drops the scope."""
    try:
        response = await route
    except asyncio.CancelledError:
        if request.scope is not None:
            exchange.abandon(request.scope)
            request.scope = None
        raise
    except Exception as exc:
        return failure(exchange, request, exc)
    return success(exchange, request, response)


def with_request_id(scope: RequestScope, response: HttpResponse) -> HttpResponse:
    """``response`` carrying the request's id, when it is safe to echo."""
    request_id = scope.echoed_id()
    if request_id is not None:
        response.headers.append((b"x-request-id", request_id))
    return response
