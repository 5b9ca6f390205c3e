"""An HTTP/1.1 connection's clocks and its standing with the connection cap.

:class:`Deadlines` is the base class of :class:`~ortserve.server.http.connection.HttpConnection`
(and itself built on :class:`~ortserve.server.http.responder.Responder`), not an object beside
it: the parser's callbacks set the deadline stamps on every request, and as one object each
stays an attribute of ``self``. It keeps one timer per connection that enforces them, the
intake governor's parking (time parked is the server's, not the client's), and what the
:class:`~ortserve.server.connection_limit.ConnectionLimit` is told: idle, receiving a request
(evictable by its progress) or serving one (never evicted).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import socket
import struct
from dataclasses import dataclass

from ortserve.server.connection_limit import ARRIVING, AT_REST, SERVING, ConnectionLimit
from ortserve.server.http.responder import Responder

__all__ = ["BODY", "BUSY", "HEAD", "IDLE", "ConnectionLimits", "Deadlines"]

_RESET = struct.pack("ii", 1, 0)
"""SO_LINGER on with a zero timeout: closing the socket resets it and drops what it holds."""

# What a connection is waiting for, and so what its deadline means.
IDLE = 0  # the next request head: close quietly at the deadline
HEAD = 1  # the rest of a request head: 408 at the deadline
BODY = 2  # the rest of a request body: 408 at the deadline
BUSY = 3  # our answer: no deadline


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Bounds on what one connection may make the server hold."""

    max_body_bytes: int = 64 * 1024 * 1024
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    keepalive_timeout_s: float = 75.0
    header_timeout_s: float = 10.0
    min_body_rate: float = 500.0
    """A body may take ``header_timeout_s`` plus one second per this many bytes (Apache's
    mod_reqtimeout rule): a slow link still uploads, a trickle cannot hold a connection."""
    request_timeout_s: float = 120.0
    """A whole request, head and body, must arrive within this of its first byte, whatever its
    rate: a trickle just above ``min_body_rate`` held a place for hours (64 MiB at 600 B/s)."""


class Deadlines(Responder, abc.ABC):
    """The deadline stamps, the timer that enforces them, and the connection cap's view.

    The connection sets the stamps as a request arrives (:attr:`_phase`, :attr:`_deadline`,
    :attr:`_request_started`, :attr:`_body_started`) and counts what it reads
    (:attr:`_received`); answering a request that missed them is its own (:meth:`_reject`).
    """

    _limits: ConnectionLimits
    _limit: ConnectionLimit
    _timer: asyncio.TimerHandle | None
    _tick: float
    _phase: int
    _deadline: float
    _request_started: float
    _body_started: float
    _parked_at: float
    _received: int
    _told: int

    @abc.abstractmethod
    def _reject(self, status: int, message: str) -> None:
        """Answer ``status`` with ``message`` and close (the request missed its deadline)."""

    def park(self) -> None:
        self._parked = True
        self._parked_at = self._loop.time()
        if self._transport is not None and self._reading and not self._closed:
            self._transport.pause_reading()
            self._reading = False

    def unpark(self) -> None:
        self._parked = False
        # Time parked was the server's, not the client's: the request clocks skip it.
        parked = self._loop.time() - self._parked_at
        self._body_started += parked
        self._request_started += parked
        if not self._busy:
            self._resume_reading()

    def _to_idle(self) -> None:
        """Nothing is owed: wait for the next request head, evictable by the connection cap
        (or, when the next request is arriving already, by its progress).

        The deadline is a stamp, not a timer: one timer per connection ticks at most every
        ``min(header, keep-alive timeout)`` and re-arms for the remainder, so a request costs
        no timer operations, and every deadline set is at least one tick ahead.
        """
        if self._receiving:  # pipelined: the next request's own deadline runs already
            self._tell()
            return
        self._phase = IDLE
        self._deadline = self._loop.time() + self._limits.keepalive_timeout_s
        if self._told == AT_REST:
            self._limit.touch(self)  # idle again after a request: the back of the idle line
        else:
            self._told = AT_REST
            self._limit.idle(self)

    def _tell(self) -> None:
        """Tell the connection cap what this connection is doing: serving a whole request
        (never closed for a newcomer), receiving one (closed by its progress), or idle.

        At the end of a read that leaves a request arriving or being answered, and when the
        answers run out (``_to_idle``): the cap acts only between callbacks (at an accept), so a
        request read and answered within one read costs it one move in the idle line, not a
        round trip through its states.
        """
        told = self._told
        if self._busy or self._queue:
            if told != SERVING:
                self._told = SERVING
                self._limit.busy(self)
        elif self._receiving:
            if told != ARRIVING:
                self._told = ARRIVING
                self._limit.receiving(self)
        elif told != AT_REST:
            self._told = AT_REST
            self._limit.idle(self)
        else:
            self._limit.touch(self)  # idle again after a request: the back of the idle line

    def _on_timer(self) -> None:
        self._timer = None
        if self._closed:
            return
        now = self._loop.time()
        remaining = self._deadline - now
        if self._phase == HEAD or self._phase == BODY:
            # Whatever its rate, a request arrives whole within request_timeout_s (checked
            # here, not per byte: the timer ticks at least every header timeout).
            remaining = min(remaining, self._request_started + self._limits.request_timeout_s - now)
        if (
            self._write_paused
            and self._loop.time() - self._write_paused_at >= self._limits.keepalive_timeout_s
        ):
            # The client has read none of our answers for a keep-alive timeout: reset it. A
            # close, even an abort, left the unsent answers (megabytes) in the kernel's send
            # queue for as long as the client kept its window shut (FIN-WAIT-1).
            if self._transport is not None:
                with contextlib.suppress(OSError, AttributeError):
                    self._transport.get_extra_info("socket").setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, _RESET
                    )
            self.abort()
            return
        if self._parked:  # the server stopped reading, not the client: its clock restarts
            self._deadline = self._loop.time() + self._tick
            remaining = self._tick
        if self._phase == BUSY:
            # No deadline while we answer: the stamp left from the request's arrival passes
            # during a long answer (a generation queued or streaming past the header timeout),
            # and re-arming for it woke the loop every millisecond per such connection (at 2x an
            # LLM's capacity, 40 connections: the engine's core lost to timers). One tick for
            # the paused-write check.
            self._timer = self._loop.call_later(self._tick, self._on_timer)
        elif remaining > 0:
            self._timer = self._loop.call_later(min(max(remaining, 0.001), self._tick), self._on_timer)
        elif self._phase == IDLE:
            self._close()
        else:
            self._reject(408, "the request was not received in time")

    @property
    def received(self) -> int:
        """Bytes read from the client so far (the connection cap ranks progress by it)."""
        return self._received

    def evict(self) -> None:
        """The connection cap needs this place (the connection is idle, or its request is
        arriving slower than the others'): leave it now and close."""
        self._state.discard(self)
        self._closed = True
        if self._transport is not None:
            self._transport.close()

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
