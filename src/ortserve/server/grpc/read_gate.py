"""When an HTTP/2 connection reads: four reasons to stop, reading again only once none holds.

A connection stops reading its socket when the peer does not read our answers (so it cannot
make us buffer them), when the intake governor parks it (the loop is saturated), when one of
its requests came too late (it rests), and after it closed. Each reason is cleared by its own
event, so each has its own flag and the transport resumes only when all are clear: one event
must never resume what another paused.
"""

from __future__ import annotations

import asyncio

__all__ = ["ReadGate"]


class ReadGate(asyncio.Protocol):
    """The reading half of a connection's flow control, a base of
    :class:`~ortserve.server.grpc.connection.Http2Connection` (one object per connection).

    The subclass sets ``_transport`` at ``connection_made`` and ``_closed`` when it ends, and
    is told through :meth:`_skip` of the time the server chose not to read, which the
    requests' arrival clocks must not count against the client.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._closed = False
        self._reading = True
        self._write_paused = False
        self._parked = False  # the intake governor paused reading (the loop is saturated)
        self._parked_at = 0.0
        self._resting = False  # a request came too late: nothing is read for a while (_rest)

    def _skip(self, seconds: float) -> None:
        """The server did not read for ``seconds`` by its own choice (parked or resting)."""

    def pause_writing(self) -> None:
        # The peer is not reading: stop reading its requests so it cannot make us buffer answers.
        self._write_paused = True
        self._pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._resume_reading()

    def park(self) -> None:
        self._parked = True
        self._parked_at = self._loop.time()
        self._pause_reading()

    def unpark(self) -> None:
        self._parked = False
        self._skip(self._loop.time() - self._parked_at)  # the server's time, not the client's
        self._resume_reading()

    def _rest(self, seconds: float) -> None:
        """Read nothing from this peer for ``seconds`` (a request of its came too late)."""
        if self._resting or self._closed:
            return
        self._resting = True
        self._pause_reading()
        self._skip(seconds)
        self._loop.call_later(seconds, self._end_rest)

    def _end_rest(self) -> None:
        self._resting = False
        self._resume_reading()

    def _pause_reading(self) -> None:
        if self._transport is not None and self._reading and not self._closed:
            self._transport.pause_reading()
            self._reading = False

    def _resume_reading(self) -> None:
        if (
            self._reading
            or self._write_paused
            or self._parked
            or self._resting
            or self._closed
            or self._transport is None
        ):
            return
        self._transport.resume_reading()
        self._reading = True
