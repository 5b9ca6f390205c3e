"""The request and response values the HTTP connection and the route handlers exchange."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["HttpRequest", "HttpResponse", "json_response"]


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
