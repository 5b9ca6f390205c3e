"""An HTTP request's end at the Exchange: the answer accounted for, its id echoed.

Every HTTP route that reaches a model (OIP infer, pipelines, OpenAI, generate) ends here, so
each is counted, access-logged, traced, captured and echoes ``X-Request-ID`` alike; an error's
body is the route family's own shape (OIP ``{"error": ...}``, OpenAI's object), its status and
``Retry-After`` the same for all.
"""

from __future__ import annotations

from collections.abc import Callable

from ortserve.errors import OrtServeError
from ortserve.server.exchange import Exchange
from ortserve.server.http.errors import error_response
from ortserve.server.http.messages import HttpRequest, HttpResponse
from ortserve.telemetry import RequestScope

__all__ = ["ErrorShape", "answered", "begun", "failed", "with_request_id"]

ErrorShape = Callable[[OrtServeError], HttpResponse]
"""A route family's error body: ``error_response`` (OIP) or ``openai_error_response``."""


def begun(exchange: Exchange, request: HttpRequest, model: str, version: str | None) -> RequestScope:
    """The request's scope at the Exchange: its id, trace context, and what capture keeps of
    an HTTP request. (OIP infer writes this call out in place: it is its hot path.)"""
    return exchange.begin(
        "http",
        model,
        version,
        request.header(b"x-request-id"),
        request.header(b"traceparent"),
        request.path,
        request.text_header,
        request.body,
    )


def answered(
    exchange: Exchange, scope: RequestScope, response: HttpResponse, error: OrtServeError | None
) -> HttpResponse:
    """Finish the request's scope with ``response`` and echo its id."""
    exchange.finish(scope, error, response.status)
    return with_request_id(scope, response)


def failed(
    exchange: Exchange, scope: RequestScope, exc: BaseException, shape: ErrorShape = error_response
) -> HttpResponse:
    """The answer to a request refused or failed: the settled error in ``shape``."""
    error = exchange.settle(scope, exc)
    return answered(exchange, scope, shape(error), error)


def with_request_id(scope: RequestScope, response: HttpResponse) -> HttpResponse:
    """``response`` carrying the request's id, when it is safe to echo."""
    request_id = scope.echoed_id()
    if request_id is not None:
        response.headers.append((b"x-request-id", request_id))
    return response
