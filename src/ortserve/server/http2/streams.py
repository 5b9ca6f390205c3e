"""The engine's stream table: which streams are open, what the application sends on them, how
each ends, and the connection's graceful end once none is left.

:class:`StreamTable` is the base class of :class:`~ortserve.server.http2.engine.Http2Engine`
(through :class:`~ortserve.server.http2.control.ControlFrames`), not an object beside it: the
frame loop reads and writes the table on every frame, and as one object every such access stays
an attribute of ``self`` and every step one method call.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from ortserve.server.http2.config import EngineConfig
from ortserve.server.http2.events import Event
from ortserve.server.http2.frames import ErrorCode, goaway_frame, rst_stream_frame, window_update_frame
from ortserve.server.http2.outbound import Outbound
from ortserve.server.http2.stream import Stream

__all__ = ["StreamTable"]

_H = TypeVar("_H")


class StreamTable(Generic[_H]):
    """The streams of one connection and the application's calls on them.

    Args:
        config: limits and timers.
    """

    def __init__(self, config: EngineConfig) -> None:
        self._config = config
        self._streams: dict[int, Stream] = {}
        self.awaiting: dict[int, Stream] = {}
        """Streams whose request has not ended, timed against the request deadline (oldest
        first); a stream leaves at END_STREAM, when it ends otherwise, or when the application
        says its requests are messages with a pace of their own (:meth:`open_ended`). The
        application only reads it (an attribute, not a property: it is read after every read)."""
        self._last_stream_id = 0
        self._events: list[Event[_H]] = []
        self.closed = False
        """The connection is over: send what :meth:`data_to_send` has, then close the transport.
        (An attribute, not a property: it is read after every read and every answer.)"""
        self._going_away = False
        self._out = Outbound(self)
        # The connection's receive window: what the peer may still send, what it sent that we
        # have not yet given back, and how much we give back at once.
        self._recv_window = config.connection_window
        self._recv_unacked = 0
        self._window_refresh = config.connection_window // 2

    # -- state --------------------------------------------------------------------------
    @property
    def open_streams(self) -> int:
        """Streams open or half-closed."""
        return len(self._streams)

    @property
    def last_stream_id(self) -> int:
        """The highest stream id the peer has used: streams above it are idle, below it closed
        unless open."""
        return self._last_stream_id

    @property
    def open_stream_ids(self) -> frozenset[int]:
        """Ids of the streams open or half-closed."""
        return frozenset(self._streams)

    def data_to_send(self) -> list[bytes | memoryview]:
        """Bytes to write, in order; empty when there are none."""
        out = self._out.out
        if out:
            self._out.out = []
        return out

    # -- the application's side -----------------------------------------------------------
    def send_response(self, stream_id: int, headers: bytes, payload: bytes, trailers: bytes) -> None:
        """A whole answer of one DATA payload: headers, payload, closing header block.

        Ignored for a stream that is gone (reset, or the connection ended) or already ended.
        """
        stream = self._streams.get(stream_id)
        if (
            stream is not None
            and not stream.local_closed
            and self._out.answer(stream, headers, payload, trailers)
        ):
            # All of it went out at once (the common case): our side is done, as local_done does.
            if not stream.remote_closed:
                self._out.write(rst_stream_frame(stream_id, ErrorCode.NO_ERROR))
                stream.remote_closed = True
                self.awaiting.pop(stream_id, None)
            del self._streams[stream_id]
            if self._going_away:
                self._close_if_done()

    def send_headers(self, stream_id: int, block: bytes, end_stream: bool = False) -> None:
        """A header block; ``end_stream`` makes it the last (trailers, or a headers-only answer)."""
        stream = self._streams.get(stream_id)
        if stream is not None and not stream.local_closed:
            self._out.headers(stream, block, end_stream)

    def send_data(self, stream_id: int, payload: bytes | memoryview) -> None:
        """Body bytes, sent as the peer's windows allow (queued until then)."""
        stream = self._streams.get(stream_id)
        if stream is not None and not stream.local_closed:
            self._out.data(stream, payload)

    def reset_stream(self, stream_id: int, code: ErrorCode = ErrorCode.CANCEL) -> None:
        """End a stream abruptly, dropping what it still had to send."""
        stream = self._streams.pop(stream_id, None)
        self.awaiting.pop(stream_id, None)
        if stream is None or self.closed:
            return
        self._out.forget(stream)
        self._out.write(rst_stream_frame(stream_id, code))
        self._close_if_done()

    def open_ended(self, stream_id: int) -> None:
        """The stream's requests are messages that come at the peer's pace (a streaming call):
        its request is no longer timed (keepalive, and the connection cap, still watch it)."""
        self.awaiting.pop(stream_id, None)

    @property
    def awaiting_requests(self) -> int:
        """Streams whose request is still arriving and is timed."""
        return len(self.awaiting)

    def consumed(self, stream_id: int) -> None:
        """The application took all the data it was given on the stream: the peer may send more."""
        stream = self._streams.get(stream_id)
        if stream is not None:
            stream.unconsumed = False
            self.grant(stream)

    def go_away(self) -> None:
        """Graceful shutdown: refuse new streams, finish the open ones, then close."""
        if self.closed:
            return
        self._going_away = True
        self._out.write(goaway_frame(self._last_stream_id, ErrorCode.NO_ERROR))
        self._close_if_done()

    def credit_connection(self) -> None:
        """Give the peer back the connection window its DATA used, unless answers wait for its
        windows beyond ``connection_window`` bytes: a peer that reads our answers but grants
        no window could otherwise send requests without end and make their answers pile up
        here (each stream's own window stops only that stream). Granted again as they leave.
        """
        unacked = self._recv_unacked
        if unacked >= self._window_refresh and self._out.waiting <= self._config.connection_window:
            self._out.write(window_update_frame(0, unacked))
            self._recv_window += unacked
            self._recv_unacked = 0

    # -- SendOwner ------------------------------------------------------------------------
    def grant(self, stream: Stream) -> None:
        """Reopen a stream's receive window, unless the application is behind on it.

        A stream whose data the application has not consumed, or whose answers wait for the
        peer's window, gets no more: flow control, not memory, makes the peer wait.
        """
        if self._recv_unacked:
            self.credit_connection()
        window = self._config.stream_window
        if (
            stream.remote_closed
            or stream.unconsumed
            or stream.recv_window >= window // 2
            or stream.outbound_bytes > window
            or self._streams.get(stream.stream_id) is not stream
        ):
            return
        self._out.write(window_update_frame(stream.stream_id, window - stream.recv_window))
        stream.recv_window = window

    def local_done(self, stream: Stream) -> None:
        """Our side of the stream ended; a peer still sending is told to stop."""
        if not stream.remote_closed:
            self._out.write(rst_stream_frame(stream.stream_id, ErrorCode.NO_ERROR))
            stream.remote_closed = True
            self.awaiting.pop(stream.stream_id, None)
        self._forget(stream)

    # -- ends -----------------------------------------------------------------------------
    def _remote_done(self, stream: Stream) -> None:
        if stream.local_closed and not stream.outbound:
            self._forget(stream)

    def _forget(self, stream: Stream) -> None:
        if self._streams.pop(stream.stream_id, None) is not None and self._going_away:
            self._close_if_done()

    def _close_if_done(self) -> None:
        if self._going_away and not self._streams and not self.closed:
            self.closed = True
