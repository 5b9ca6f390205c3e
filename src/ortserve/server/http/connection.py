"""HTTP/1.1 over asyncio: one protocol object per connection, parsed by httptools.

A thin server of our own instead of an ASGI stack: measured on this machine it answers
about 5x the requests of uvicorn's ASGI path on one core (benchmarks/RESULTS.md), and the
per-request overhead is what the small-model targets are made of. It keeps what clients
rely on: keep-alive, HTTP/1.0, chunked request bodies, ``Expect: 100-continue``, pipelined
requests answered in order, body and header limits, an idle timeout, and a 400 that closes
the connection on anything it cannot parse.

What one connection may hold is bounded in time and memory: a request head must arrive within
``header_timeout_s``, its body at a minimum average rate (slowloris), the whole request within
``request_timeout_s`` (a trickle just above the rate), an idle keep-alive connection closes
after ``keepalive_timeout_s``, body bytes count against the server-wide
:class:`~ortserve.server.connections.ByteBudget` until answered, and nothing keeps a body
alive once its request is answered (the parser, which references the connection, is dropped
when the connection closes, so neither waits for the cyclic garbage collector).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from urllib.parse import unquote

import httptools

from ortserve.protocol.http_codec import encode_error
from ortserve.server.connection_limit import ARRIVING
from ortserve.server.connections import ByteBudget, ConnectionSet, peer_address
from ortserve.server.http.deadlines import BODY, BUSY, HEAD, IDLE, ConnectionLimits, Deadlines
from ortserve.server.http.messages import HttpRequest, HttpResponse
from ortserve.server.http.plain_post import TargetScreen, screen_whole
from ortserve.server.http.responder import Handler
from ortserve.server.http.run_queue import RunQueue
from ortserve.server.http.wire import CannedResponse
from ortserve.telemetry import echoable_id

__all__ = ["Admission", "ConnectionLimits", "HttpConnection", "TargetScreen"]

logger = logging.getLogger(__name__)

Admission = Callable[[bytes, bytes, dict[bytes, bytes]], "CannedResponse | None"]
"""``(method, url, headers) -> a refusal`` asked once the headers are in (None: go on)."""


_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_METHODS = {m.encode(): m for m in ("GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH")}
_DISCARD_TIMEOUT_S = 5.0
_MAX_DISCARD = 256 * 1024 * 1024
_PEER_BODY = encode_error("too many connections from this address")
_TOO_MANY_FROM_PEER = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
    b"retry-after: 1\r\nconnection: close\r\n\r\n%s" % (len(_PEER_BODY), _PEER_BODY)
)
_RETRY_AFTER = [(b"retry-after", b"1"), (b"connection", b"close")]


class _TooLarge(Exception):
    pass


class _BadRequest(Exception):
    pass


class _OverBudget(Exception):
    pass


class _UnknownCoding(Exception):
    """A transfer coding other than chunked (RFC 9112 6.1: 501)."""


class HttpConnection(Deadlines):
    """Parses requests within the limits; :class:`~ortserve.server.http.deadlines.Deadlines`,
    its base, keeps its clocks and its standing with the connection cap, and
    :class:`~ortserve.server.http.responder.Responder`, below that, answers them."""

    def __init__(
        self,
        handler: Handler,
        limits: ConnectionLimits,
        state: ConnectionSet[HttpConnection],
        loop: asyncio.AbstractEventLoop,
        budget: ByteBudget | None = None,
        admission: Admission | None = None,
        screen: TargetScreen | None = None,
        runs: RunQueue | None = None,
    ) -> None:
        super().__init__(handler, state, loop, budget if budget is not None else ByteBudget(1 << 62))
        self._admission = admission
        self._screen = screen  # refuses whole plain POSTs from their first bytes, unparsed
        self._screened = False  # the next head's target was screened already (and admitted)
        self._runs = runs  # admitted requests run after the loop's reads (None: at once)
        self._recheck: bytes | None = None  # the deferred request's target, asked again at its run
        self._refusal: CannedResponse | None = None  # this request is refused: its body is dropped
        self._refusal_sent = False  # ... and its answer is written already
        self._limits = limits
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._header_bytes = 0
        self._body: list[bytes] = []
        self._body_size = 0
        self._parked_at = 0.0
        self._intake = state.intake
        self._timer: asyncio.TimerHandle | None = None
        self._tick = min(limits.header_timeout_s, limits.keepalive_timeout_s, limits.request_timeout_s)
        self._phase = IDLE
        self._now = loop.time()
        self._deadline = self._now + limits.header_timeout_s
        self._body_started = 0.0
        self._request_started = 0.0  # of the request arriving (request_timeout_s counts from it)
        self._received = 0
        self._told = ARRIVING  # a new connection: its first request is to come
        self._discard_left: int | None = None
        self._upgrade_offered = False
        # Member and evictable from the listener's accept on: a loop may accept a burst of
        # sockets before any connection_made runs, and a real client in the same burst must
        # still be able to take a silent socket's place (or a stalled request's: a new
        # connection ranks with the requests arriving, from its accept on, so a burst of new
        # clients closes the oldest stalled ones rather than one another).
        self._limit = state.limit
        state.connections.add(self)
        state.limit.receiving(self)

    # -- asyncio.Protocol -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport
        if self._closed:  # evicted before it was made
            transport.close()
            return
        if self._limit.per_peer and not self._limit.join_peer(self, peer_address(transport)):
            transport.write(_TOO_MANY_FROM_PEER)  # type: ignore[attr-defined]
            self._close()
            return
        self._timer = self._loop.call_later(self._tick, self._on_timer)

    def pause_writing(self) -> None:
        if self._runs is not None:
            self._runs.write_pauses += 1
        super().pause_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._state.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the client is gone; a queued request is skipped
        self._queue.clear()
        self._intake.forget(self)
        self._forget_bodies()
        self._body = []
        self._parser = None  # it references this connection: break the cycle now, not at a GC pass

    def data_received(self, data: bytes) -> None:
        if self._closed or self._parser is None:
            return
        self._received += len(data)
        if self._discard_left is not None:
            self._discard(len(data))
            return
        self._now = self._loop.time()
        if (
            self._screen is not None
            and data[:5] == b"POST "
            and not (self._receiving or self._busy or self._queue or self._state.closing)
        ):
            data = self._refuse_whole(data)
            if not data:
                if self._intake.saturated:
                    self._intake.admit_more(self)
                return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            if not self._upgrade_offered:  # CONNECT: a tunnel, which this server is not
                self._reject(400, "protocol upgrades are not supported")
                return
            # An offer to switch protocols (h2c from curl --http2 or Java's RestClient, a
            # WebSocket): served as plain HTTP/1.1 (RFC 9110 7.8). The parser stopped after
            # the head as if the rest were another protocol; a fresh one reads the head again
            # without the offer, then the body and whatever follows.
            self._upgrade_offered = False
            head = self._head_without_upgrade()
            self._parser = httptools.HttpRequestParser(self)
            self.data_received(head + data[upgrade.args[0] :])
            return
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            if isinstance(cause, _TooLarge):
                self._reject_and_discard(413, "request body exceeds the size limit")
            elif isinstance(cause, _OverBudget):
                self._reject_and_discard(429, "the server holds too many request bytes", _RETRY_AFTER)
            elif isinstance(cause, _BadRequest):
                self._reject(400, str(cause))
            elif isinstance(cause, _UnknownCoding):
                self._reject(501, "only the chunked transfer coding is supported")
            elif cause is not None and not isinstance(cause, httptools.HttpParserError):
                logger.error("HTTP connection failed", exc_info=cause)
                self._reject(500, "internal server error")
            else:
                self._reject(400, f"malformed HTTP request: {exc}")
            return
        if self._receiving or self._busy or self._queue:
            self._tell()  # (a request read and answered within the read told it already)
        if self._intake.saturated:
            self._intake.admit_more(self)

    def _refuse_whole(self, data: bytes) -> bytes:
        """Refuse the whole plain POSTs at the start of ``data`` from their bytes alone
        (:func:`~ortserve.server.http.plain_post.screen_whole`), all their answers in one
        write; the rest of ``data`` is for the parser."""
        assert self._screen is not None
        screened = screen_whole(data, self._screen, self._limits)
        if screened.admitted:
            self._screened = True  # the parser's on_headers_complete need not ask again
        if not screened.answers:
            return data
        assert self._transport is not None
        self._transport.write(screened.answers)
        self._to_idle()
        return data[screened.rest :]

    # -- httptools callbacks ----------------------------------------------------------
    def on_message_begin(self) -> None:
        self._receiving = True
        self._phase = HEAD
        self._request_started = self._now
        self._deadline = self._now + self._limits.header_timeout_s
        self._url = b""
        self._headers = {}
        self._header_bytes = 0
        self._body = []
        self._body_size = 0
        self._refusal = None
        self._refusal_sent = False

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
        assert self._parser is not None
        if self._parser.should_upgrade() and self._parser.get_method() != b"CONNECT":
            self._upgrade_offered = True  # read again without the offer (data_received)
            return
        coding = self._headers.get(b"transfer-encoding")
        if coding is not None and coding.strip().lower() != b"chunked":
            raise _UnknownCoding()  # "gzip, chunked" was read as chunked, the gzip ignored
        length = self._headers.get(b"content-length")
        if length is not None and length.isdigit():
            size = int(length)
            if size > self._limits.max_body_bytes:
                raise _TooLarge()
            if not self._budget.fits(size):
                raise _OverBudget()
        self._phase = BODY
        self._body_started = self._now
        self._deadline = self._now + self._limits.header_timeout_s
        if self._screened:
            self._screened = False  # asked from its first bytes already, and admitted
        elif self._admission is not None:
            parser = self._parser
            assert parser is not None
            refusal = self._refusal = self._admission(parser.get_method(), self._url, self._headers)
            if refusal is not None:
                # Answered at once when nothing earlier is owed on this connection: the body
                # is then only read and dropped. A connection that closes after this request
                # answers once the body is in (closing now would reset it under the client).
                if (
                    not self._busy
                    and not self._queue
                    and parser.should_keep_alive()
                    and not self._state.closing
                ):
                    self._refusal_sent = True
                    assert self._transport is not None
                    self._transport.write(refusal.wire(keep_alive=True))
                return
        if (
            self._headers.get(b"expect", b"").lower() == b"100-continue"
            and self._transport
            and (coding is not None or (length is not None and length != b"0"))  # a body to wait for
        ):
            self._transport.write(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        size = len(body)
        self._body_size += size
        if self._body_size > self._limits.max_body_bytes:
            raise _TooLarge()
        limits = self._limits
        self._deadline = self._body_started + limits.header_timeout_s + self._body_size / limits.min_body_rate
        if self._refusal is not None:
            return  # refused from its headers: the body is read and dropped, never held
        if not self._budget.take(size):
            raise _OverBudget()
        self._held += size
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._upgrade_offered:  # the head is read again, with the body (data_received)
            return
        self._receiving = False
        self._phase = BUSY
        if self._parser is None:
            return
        if self._refusal is not None and self._refusal_sent:
            self._refusal_sent = False
            self._to_idle()  # it was answered when nothing else was owed, and nothing is
            return
        if self._refusal is not None:
            self._enqueue(self._refusal, 0)
            return
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
        if len(self._body) > 1:
            self._budget.freed(self._body_size)  # the pieces, now joined
        self._body = []  # the request owns the body now; nothing else may keep it alive
        runs = self._runs
        if runs is None or self._busy or self._queue:
            self._enqueue(request, self._body_size)
            return
        # Read and refuse before running: the handler runs after this iteration's reads.
        self._queue.append((request, self._parser.should_keep_alive(), self._body_size))
        self._busy = True  # held for its turn: what follows on this connection queues behind it
        screened = self._screen is not None and request.method == "POST" and b"expect" not in self._headers
        self._recheck = self._url if screened else None
        runs.defer(self)

    def run_deferred(self) -> None:
        """The run queue's turn: ask the deferred request's verdict again (the queue may have
        filled since its head was read) and run it, or answer its refusal without decoding it."""
        self._busy = False
        if self._closed:
            return
        url, self._recheck = self._recheck, None
        if url is not None and self._queue:
            assert self._screen is not None
            verdict = self._screen(url, again=True)
            if isinstance(verdict, CannedResponse):
                request, keep_alive, size = self._queue[0]
                if isinstance(request, HttpRequest):  # its X-Request-ID echoed, as at its head
                    echoed = echoable_id(request.header(b"x-request-id"))
                    if echoed is not None:
                        verdict = verdict.with_header(b"x-request-id", echoed)
                self._queue[0] = (verdict, keep_alive, 0)
                self._budget.give(size)  # its body is dropped unread
                self._held -= size
        self._next()

    def _head_without_upgrade(self) -> bytes:
        """The request head just read, without its protocol-switch offer (the Upgrade and
        HTTP2-Settings fields, and their tokens in Connection)."""
        assert self._parser is not None
        version = self._parser.get_http_version().encode("ascii")
        lines = [b"%s %s HTTP/%s\r\n" % (self._parser.get_method(), self._url, version)]
        for name, value in self._headers.items():
            if name in (b"upgrade", b"http2-settings"):
                continue
            if name == b"connection":
                tokens = [t.strip() for t in value.split(b",")]
                value = b", ".join(t for t in tokens if t.lower() not in (b"upgrade", b"http2-settings"))
                if not value:
                    continue
            lines.append(name + b": " + value + b"\r\n")
        return b"".join(lines) + b"\r\n"

    # -- failures ---------------------------------------------------------------------
    def _reject(self, status: int, message: str) -> None:
        self._queue.clear()
        if self._busy or self._refusal_sent:
            self._close()  # a response is still owed for an earlier request; just hang up
            return
        self._write(HttpResponse(status, [encode_error(message)]), keep_alive=False)
        self._close()

    def _reject_and_discard(
        self, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        """Answer, then read and drop the rest of the body before closing.

        Closing at once would reset the connection while the client is still sending, and a
        client that writes its whole body before reading would never see the 413.
        """
        if self._busy or self._refusal_sent or self._transport is None:
            self._close()
            return
        self._queue.clear()
        self._body = []
        self._forget_bodies()
        closing = headers or [(b"connection", b"close")]
        self._write(HttpResponse(status, [encode_error(message)], headers=closing), keep_alive=True)
        # A chunked body's end is unknown without parsing it: drop what comes until the timeout.
        declared = self._headers.get(b"content-length")
        self._discard_left = int(declared) if declared is not None and declared.isdigit() else _MAX_DISCARD
        self._loop.call_later(_DISCARD_TIMEOUT_S, self._close)
        self._discard(0)

    def _discard(self, received: int) -> None:
        assert self._discard_left is not None
        self._discard_left -= received
        if self._discard_left <= 0 or self._discard_left > _MAX_DISCARD:
            self._close()
