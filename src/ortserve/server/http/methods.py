"""HTTP method rules every route shares: 405 with ``Allow``, HEAD as GET without a body, OPTIONS.

Routes only say which method they take (``method_not_allowed("GET")``); what HEAD and OPTIONS
mean follows from that here, once, instead of in every route.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ortserve.protocol.http_codec import encode_error
from ortserve.server.http.messages import HttpRequest, HttpResponse, RouteResult, json_response, map_response

__all__ = ["allow_header", "answer_methods", "method_not_allowed"]

_ALLOW = b"allow"


def allow_header(*methods: str) -> bytes:
    """The ``Allow`` value for a resource taking ``methods`` (HEAD comes with GET, OPTIONS always)."""
    allowed = list(dict.fromkeys(methods))
    if "GET" in allowed and "HEAD" not in allowed:
        allowed.insert(allowed.index("GET") + 1, "HEAD")
    allowed.append("OPTIONS")
    return ", ".join(allowed).encode()


def method_not_allowed(*methods: str) -> HttpResponse:
    """405 naming what the resource does take (RFC 9110 15.5.6 requires ``Allow``)."""
    return json_response(405, encode_error("method not allowed"), [(_ALLOW, allow_header(*methods))])


def answer_methods(request: HttpRequest, route: Callable[[HttpRequest], RouteResult]) -> RouteResult:
    """Route ``request``, answering HEAD and OPTIONS from what its resource answers to GET.

    HEAD runs the GET route and keeps its status, headers and length without the body.
    OPTIONS asks the route with a method no route takes: a 405 carries the resource's
    ``Allow``, which becomes a 204; anything else (404) is answered as is.
    """
    if request.method == "HEAD":
        return map_response(route(dataclasses.replace(request, method="GET")), _headless)
    if request.method == "OPTIONS":
        return map_response(route(request), _options)
    return route(request)


def _headless(response: HttpResponse) -> HttpResponse:
    return dataclasses.replace(response, omit_body=True)  # routes may answer with shared constants


def _options(response: HttpResponse) -> HttpResponse:
    if response.status != 405:
        return response
    allow = [(name, value) for name, value in response.headers if name == _ALLOW]
    return HttpResponse(204, [], headers=allow)
