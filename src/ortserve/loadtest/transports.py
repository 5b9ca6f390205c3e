"""A lean HTTP/1.1 keep-alive client for load generation (asyncio protocol + httptools)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

import httptools

__all__ = ["CONNECTION_ERROR", "TIMEOUT", "HttpClient", "HttpTarget", "Payload", "Reply"]

CONNECTION_ERROR = 0
"""Status recorded when the connection failed or closed before a full response."""
TIMEOUT = 1
"""Status recorded when no response came within the request timeout."""


Closer = Callable[[], Awaitable[None]]
"""Closes what a target opened for its clients (run inside the event loop)."""


class Client(Protocol):
    """Sends pre-built request bytes and awaits the reply (one request in flight)."""

    async def send(self, wire: bytes) -> Reply: ...


class Target(Protocol):
    """A server the generator can open clients to (picklable: sent to generator processes)."""

    def open_clients(self, count: int, timeout_s: float) -> tuple[list[Client], Closer]: ...


@dataclass(frozen=True, slots=True)
class Payload:
    """One request ready to send: path, body and the headers that describe the body."""

    path: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = (("content-type", "application/json"),)


@dataclass(frozen=True, slots=True)
class Reply:
    """A response: status (or CONNECTION_ERROR / TIMEOUT), body and binary header length."""

    status: int
    body: bytes = b""
    header_length: int | None = None


@dataclass(frozen=True, slots=True)
class HttpTarget:
    """Where requests go: ``http://host:port`` with an optional path prefix."""

    host: str
    port: int
    prefix: str = ""

    @classmethod
    def parse(cls, url: str) -> HttpTarget:
        """Parse ``http://host[:port][/prefix]`` (``host:port`` alone is accepted too)."""
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"not an http:// URL: {url!r}")
        return cls(parts.hostname, parts.port or 80, parts.path.rstrip("/"))

    def open_clients(self, count: int, timeout_s: float) -> tuple[list[Client], Closer]:
        """One keep-alive connection per client, opened at its first request."""
        connections = [HttpClient(self, timeout_s) for _ in range(count)]

        async def close() -> None:
            for connection in connections:
                connection.close()

        clients: list[Client] = list(connections)
        return clients, close

    def wire(self, payload: Payload) -> bytes:
        """The complete request bytes, built once and written as is for every send."""
        lines = [
            f"POST {self.prefix}{payload.path} HTTP/1.1",
            f"host: {self.host}:{self.port}",
            f"content-length: {len(payload.body)}",
            *(f"{name}: {value}" for name, value in payload.headers),
        ]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload.body


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[Reply]
    chunks: list[bytes] = field(default_factory=list)
    header_length: int | None = None
    timer: asyncio.TimerHandle | None = None


class _ClientProtocol(asyncio.Protocol):
    """One keep-alive connection with at most one request in flight."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._pending: _Pending | None = None
        self._header_name = b""
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(CONNECTION_ERROR)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self._fail(CONNECTION_ERROR)
            self.close()

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"inference-header-content-length" and self._pending is not None:
            self._pending.header_length = int(value)

    def on_body(self, body: bytes) -> None:
        if self._pending is not None:
            self._pending.chunks.append(body)

    def on_message_complete(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        if pending.timer is not None:
            pending.timer.cancel()
        if not pending.future.done():
            body = b"".join(pending.chunks)
            pending.future.set_result(Reply(self._parser.get_status_code(), body, pending.header_length))
        if not self._parser.should_keep_alive():
            self.close()

    def send(self, wire: bytes, timeout_s: float) -> asyncio.Future[Reply]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Reply] = loop.create_future()
        if self.closed or self._transport is None:
            future.set_result(Reply(CONNECTION_ERROR))
            return future
        pending = _Pending(future)
        pending.timer = loop.call_later(timeout_s, self._timed_out, pending)
        self._pending = pending
        self._transport.write(wire)
        return future

    def _timed_out(self, pending: _Pending) -> None:
        if self._pending is pending:
            self._fail(TIMEOUT)
            self.close()

    def _fail(self, status: int) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        if pending.timer is not None:
            pending.timer.cancel()
        if not pending.future.done():
            pending.future.set_result(Reply(status))

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()


class HttpClient:
    """A single keep-alive connection that reconnects after a failure.

    Args:
        target: where to connect.
        timeout_s: how long one request may take before it counts as TIMEOUT.
    """

    def __init__(self, target: HttpTarget, timeout_s: float = 30.0) -> None:
        self._target = target
        self._timeout_s = timeout_s
        self._protocol: _ClientProtocol | None = None

    async def send(self, wire: bytes) -> Reply:
        """Send pre-built request bytes (see :meth:`HttpTarget.wire`) and await the reply."""
        protocol = self._protocol
        if protocol is None or protocol.closed:
            try:
                protocol = await self._connect()
            except OSError:
                return Reply(CONNECTION_ERROR)
        return await protocol.send(wire, self._timeout_s)

    async def _connect(self) -> _ClientProtocol:
        loop = asyncio.get_running_loop()
        _, protocol = await asyncio.wait_for(
            loop.create_connection(_ClientProtocol, self._target.host, self._target.port),
            self._timeout_s,
        )
        self._protocol = protocol
        return protocol

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if self._protocol is not None:
            self._protocol.close()
            self._protocol = None
