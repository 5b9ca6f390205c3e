"""The request and response values the HTTP connection and the route handlers exchange."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ortserve.errors import OrtServeError
from ortserve.server.deferred import Deferred, attempt

if TYPE_CHECKING:
    from ortserve.telemetry import RequestScope

__all__ = [
    "Deferred",
    "ErrorShape",
    "HttpRequest",
    "HttpResponse",
    "RouteResult",
    "json_response",
    "map_response",
    "resolve_response",
]


@dataclass(slots=True)
class HttpRequest:
    """A complete HTTP request; header names are lower-case bytes as received."""

    method: str
    path: str
    query: str
    headers: dict[bytes, bytes]
    body: bytes
    scope: RequestScope | None = None
    """Set by a route once the request reached the Exchange: the app finishes it with the
    route's answer or error (``answers.py``), then clears it."""
    shape: ErrorShape | None = None
    """The route family's error wire (None: OIP's)."""
    tenant: str | None = None
    """The tenant the Exchange admitted the request for (None: tenancy off)."""

    def header(self, name: bytes) -> str | None:
        value = self.headers.get(name)
        return None if value is None else value.decode("latin-1")

    def text_header(self, name: str) -> str | None:
        """A header by lower-case name given as text (routing reads the headers its policy names)."""
        value = self.headers.get(name.encode("latin-1"))
        return None if value is None else value.decode("latin-1")


@dataclass(frozen=True, slots=True)
class ErrorShape:
    """A route family's error wire: the answer to a refused or failed request, and the last
    event of a stream that fails after its head is out."""

    response: Callable[[OrtServeError], HttpResponse]
    event: Callable[[OrtServeError], bytes]


@dataclass(slots=True)
class HttpResponse:
    """Status, extra headers and body buffers written in order (no copy to join them)."""

    status: int
    chunks: list[bytes | memoryview]
    content_type: bytes = b"application/json"
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    omit_body: bool = False
    """An answer to HEAD: ``content-length`` is the body's, but the body is not sent."""
    stream: AsyncIterator[bytes] | None = None
    """A body sent as it is produced (chunked), after ``chunks``: server-sent events. The
    connection closes the iterator when the client goes away."""


def json_response(status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> HttpResponse:
    return HttpResponse(status, [body], b"application/json", headers or [])


RouteResult = HttpResponse | Deferred[HttpResponse] | Coroutine[Any, Any, HttpResponse]
"""What a route answers: a response now, one a future will finish (no task per request; the
connection cancels the future if the client goes away first), or a coroutine."""


def map_response(result: RouteResult, change: Callable[[HttpResponse], HttpResponse]) -> RouteResult:
    """``result`` with ``change`` applied to its response whenever that response exists."""
    if isinstance(result, HttpResponse):
        return change(result)
    if isinstance(result, Deferred):
        finish, failed = result.finish, result.failed
        if failed is None:
            return Deferred(result.future, lambda future: change(finish(future)))
        return Deferred(result.future, lambda future: change(finish(future)), lambda exc: change(failed(exc)))
    return _changed(result, change)


async def _changed(
    result: Coroutine[Any, Any, HttpResponse], change: Callable[[HttpResponse], HttpResponse]
) -> HttpResponse:
    return change(await result)


async def resolve_response(result: RouteResult) -> HttpResponse:
    """Wait for whatever ``result`` is to become a response."""
    if isinstance(result, HttpResponse):
        return result
    if isinstance(result, Deferred):
        with contextlib.suppress(Exception):  # finish() raises it, failed() answers it
            await result.future
        answer = attempt(result.finish, result.future)
        if isinstance(answer, Exception):
            if result.failed is None:
                raise answer
            return result.failed(answer)
        return answer
    return await result
