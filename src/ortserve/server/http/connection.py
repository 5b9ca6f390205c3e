"""HTTP/1.1 over asyncio: one protocol object per connection, parsed by httptools.

A thin server of our own instead of an ASGI stack: measured on this machine it answers
about 5x the requests of uvicorn's ASGI path on one core (benchmarks/RESULTS.md), and the
per-request overhead is what the small-model targets are made of. It keeps what clients
rely on: keep-alive, HTTP/1.0, chunked request bodies, ``Expect: 100-continue``, pipelined
requests answered in order, body and header limits, an idle timeout, and a 400 that closes
the connection on anything it cannot parse.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import httptools

from ortserve.protocol.http_codec import encode_error
from ortserve.server.connections import ConnectionSet
from ortserve.server.http.messages import DeferredResponse, HttpRequest, HttpResponse

__all__ = ["ConnectionLimits", "Handler", "HttpConnection"]

logger = logging.getLogger(__name__)

Handler = Callable[[HttpRequest], "HttpResponse | DeferredResponse | Coroutine[Any, Any, HttpResponse]"]

_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
_STATUS_LINES: dict[int, bytes] = {}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_MAX_PIPELINED = 32
_METHODS = {m.encode(): m for m in ("GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH")}
_DISCARD_TIMEOUT_S = 5.0
_MAX_DISCARD = 256 * 1024 * 1024


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        line = b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown"))
        _STATUS_LINES[status] = line
    return line


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Bounds on what one connection may make the server hold."""

    max_body_bytes: int = 64 * 1024 * 1024
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    keepalive_timeout_s: float = 75.0


class _TooLarge(Exception):
    pass


class _BadRequest(Exception):
    pass


class HttpConnection(asyncio.Protocol):
    """Parses requests, runs the handler, writes responses in request order."""

    def __init__(
        self,
        handler: Handler,
        limits: ConnectionLimits,
        state: ConnectionSet[HttpConnection],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._handler = handler
        self._limits = limits
        self._state = state
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._header_bytes = 0
        self._body: list[bytes] = []
        self._body_size = 0
        self._queue: deque[tuple[HttpRequest, bool]] = deque()
        self._task: asyncio.Future[Any] | None = None
        self._busy = False
        self._receiving = False
        self._closed = False
        self._reading = True
        self._write_paused = False
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle_since = 0.0
        self._idle_armed = False
        self._discard_left: int | None = None

    # -- asyncio.Protocol -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport
        self._state.connections.add(self)
        self._arm_idle()

    def pause_writing(self) -> None:
        # The client is not reading its responses: stop reading its requests until it does,
        # so an unread peer cannot make the server buffer without bound.
        self._write_paused = True
        if self._transport is not None and self._reading and not self._closed:
            self._transport.pause_reading()
            self._reading = False

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._transport is not None and not self._reading and not self._closed and not self._queue:
            self._transport.resume_reading()
            self._reading = True

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._state.discard(self)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the client is gone; a queued request is skipped
        self._queue.clear()

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        if self._discard_left is not None:
            self._discard(len(data))
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reject(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            if isinstance(cause, _TooLarge):
                self._reject_and_discard(413, "request body exceeds the size limit")
            elif isinstance(cause, _BadRequest):
                self._reject(400, str(cause))
            elif cause is not None and not isinstance(cause, httptools.HttpParserError):
                logger.error("HTTP connection failed", exc_info=cause)
                self._reject(500, "internal server error")
            else:
                self._reject(400, f"malformed HTTP request: {exc}")

    # -- httptools callbacks ----------------------------------------------------------
    def on_message_begin(self) -> None:
        self._receiving = True
        self._url = b""
        self._headers = {}
        self._header_bytes = 0
        self._body = []
        self._body_size = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._header_bytes += len(url)
        if self._header_bytes > self._limits.max_header_bytes:
            raise _BadRequest("request line too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if (
            self._header_bytes > self._limits.max_header_bytes
            or len(self._headers) >= self._limits.max_headers
        ):
            raise _BadRequest("request headers too large")
        self._headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        length = self._headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self._limits.max_body_bytes:
            raise _TooLarge()
        if self._headers.get(b"expect", b"").lower() == b"100-continue" and self._transport:
            self._transport.write(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > self._limits.max_body_bytes:
            raise _TooLarge()
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._receiving = False
        self._cancel_idle()
        try:
            url = httptools.parse_url(self._url)
        except httptools.HttpParserInvalidURLError:  # CONNECT's host:port, or garbage
            raise _BadRequest("the request target must be a path (this server is no proxy)") from None
        raw_path = url.path.decode("latin-1")
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        request = HttpRequest(
            _METHODS.get(self._parser.get_method()) or self._parser.get_method().decode("ascii", "replace"),
            unquote(raw_path) if "%" in raw_path else raw_path,
            (url.query or b"").decode("latin-1"),
            self._headers,
            body,
        )
        self._queue.append((request, self._parser.should_keep_alive()))
        if len(self._queue) > _MAX_PIPELINED and self._transport is not None and self._reading:
            self._transport.pause_reading()
            self._reading = False
        if not self._busy:
            self._next()

    # -- request handling -------------------------------------------------------------
    def _next(self) -> None:
        while self._queue and not self._closed:
            request, keep_alive = self._queue.popleft()
            self._busy = True
            try:
                result = self._handler(request)
            except Exception:
                logger.exception("unhandled error in HTTP handler")
                result = HttpResponse(500, [encode_error("internal server error")])
            if isinstance(result, HttpResponse):
                self._write(result, keep_alive)
                continue
            if isinstance(result, DeferredResponse):
                self._task = result.future
                result.future.add_done_callback(
                    functools.partial(self._on_deferred, result.finish, keep_alive=keep_alive)
                )
                return
            task = self._loop.create_task(result)
            self._task = task
            task.add_done_callback(functools.partial(self._on_done, keep_alive=keep_alive))
            return
        self._busy = False
        if not self._reading and not self._write_paused and self._transport is not None and not self._closed:
            self._transport.resume_reading()
            self._reading = True
        if not self._queue:
            self._arm_idle()

    def _on_deferred(
        self,
        finish: Callable[[asyncio.Future[Any]], HttpResponse],
        future: asyncio.Future[Any],
        *,
        keep_alive: bool,
    ) -> None:
        self._task = None
        if future.cancelled():
            return
        try:
            response = finish(future)
        except Exception:
            logger.exception("unhandled error while building an HTTP response")
            response = HttpResponse(500, [encode_error("internal server error")])
        self._write(response, keep_alive)
        self._next()

    def _on_done(self, task: asyncio.Task[HttpResponse], *, keep_alive: bool) -> None:
        self._task = None
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            logger.error("unhandled error in HTTP handler", exc_info=error)
            response = HttpResponse(500, [encode_error("internal server error")])
        else:
            response = task.result()
        self._write(response, keep_alive)
        self._next()

    def _write(self, response: HttpResponse, keep_alive: bool) -> None:
        transport = self._transport
        if transport is None or self._closed:
            return
        keep_alive = keep_alive and not self._state.closing
        length = sum(len(c) for c in response.chunks)
        head = [
            _status_line(response.status),
            b"content-type: ",
            response.content_type,
            b"\r\ncontent-length: %d\r\n" % length,
        ]
        if response.status == 204:  # no content, and no Content-Length either (RFC 9110 8.6)
            head = head[:1]
        for name, value in response.headers:
            head.append(name + b": " + value + b"\r\n")
        if not keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        transport.writelines([b"".join(head)] if response.omit_body else [b"".join(head), *response.chunks])
        if not keep_alive:
            self._close()

    def _reject(self, status: int, message: str) -> None:
        self._queue.clear()
        if self._busy:
            self._close()  # a response is still owed for an earlier request; just hang up
            return
        self._write(HttpResponse(status, [encode_error(message)]), keep_alive=False)
        self._close()

    def _reject_and_discard(self, status: int, message: str) -> None:
        """Answer, then read and drop the rest of the body before closing.

        Closing at once would reset the connection while the client is still sending, and a
        client that writes its whole body before reading would never see the 413.
        """
        if self._busy or self._transport is None:
            self._close()
            return
        self._queue.clear()
        closing = [(b"connection", b"close")]
        self._write(HttpResponse(status, [encode_error(message)], headers=closing), keep_alive=True)
        declared = self._headers.get(b"content-length", b"0")
        self._discard_left = int(declared) if declared.isdigit() else 0
        self._loop.call_later(_DISCARD_TIMEOUT_S, self._close)
        self._discard(0)

    def _discard(self, received: int) -> None:
        assert self._discard_left is not None
        self._discard_left -= received
        if self._discard_left <= 0 or self._discard_left > _MAX_DISCARD:
            self._close()

    def _close(self) -> None:
        if self._transport is not None and not self._closed:
            self._closed = True
            self._transport.close()

    # -- idle connections -------------------------------------------------------------
    def _arm_idle(self) -> None:
        # One timer per keep-alive period, not one per request: each request only stamps the
        # time, and the timer re-arms itself for the remainder when it finds activity.
        self._idle_since = self._loop.time()
        self._idle_armed = True
        if self._idle_timer is None:
            self._idle_timer = self._loop.call_later(self._limits.keepalive_timeout_s, self._on_idle_timer)

    def _cancel_idle(self) -> None:
        self._idle_armed = False

    def _on_idle_timer(self) -> None:
        self._idle_timer = None
        if self._closed:
            return
        if not self._idle_armed:
            self._idle_timer = self._loop.call_later(self._limits.keepalive_timeout_s, self._on_idle_timer)
            return
        remaining = self._idle_since + self._limits.keepalive_timeout_s - self._loop.time()
        if remaining > 0:
            self._idle_timer = self._loop.call_later(remaining, self._on_idle_timer)
        else:
            self._close()

    @property
    def idle(self) -> bool:
        """No request is being received, handled or waiting on this connection."""
        return not self._busy and not self._queue and not self._receiving

    def abort(self) -> None:
        """Shutdown grace ran out: drop the connection."""
        if self._transport is not None and not self._closed:
            self._closed = True
            self._transport.abort()

    def close_if_idle(self) -> None:
        """Shutdown: close now if idle; a busy connection closes after its response."""
        if self.idle:
            self._close()
