"""The request and response values the HTTP connection and the route handlers exchange."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DeferredResponse", "HttpRequest", "HttpResponse", "json_response"]


@dataclass(slots=True)
class HttpRequest:
    """A complete HTTP request; header names are lower-case bytes as received."""

    method: str
    path: str
    query: str
    headers: dict[bytes, bytes]
    body: bytes

    def header(self, name: bytes) -> str | None:
        value = self.headers.get(name)
        return None if value is None else value.decode("latin-1")


@dataclass(slots=True)
class HttpResponse:
    """Status, extra headers and body buffers written in order (no copy to join them)."""

    status: int
    chunks: list[bytes | memoryview]
    content_type: bytes = b"application/json"
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


def json_response(status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> HttpResponse:
    return HttpResponse(status, [body], b"application/json", headers or [])


@dataclass(frozen=True, slots=True)
class DeferredResponse:
    """A response that ``finish`` builds once ``future`` is done (no task per request).

    The connection cancels ``future`` if the client goes away first.
    """

    future: asyncio.Future[Any]
    finish: Callable[[asyncio.Future[Any]], HttpResponse]
