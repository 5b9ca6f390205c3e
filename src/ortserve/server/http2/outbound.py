"""The send side of one HTTP/2 connection: the bytes to send, the peer's flow-control windows and
frame size, and payloads waiting for window."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Protocol

from ortserve.server.http2.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_WINDOW,
    FRAME_HEADER,
    MAX_WINDOW,
    ErrorCode,
    Flag,
    FrameType,
    Http2Error,
    data_frame,
    header_frames,
)
from ortserve.server.http2.stream import Stream

__all__ = ["Outbound", "SendOwner"]

_PACK_HEADER = FRAME_HEADER.pack
_HEADERS = int(FrameType.HEADERS)
_DATA = int(FrameType.DATA)
_END_HEADERS = Flag.END_HEADERS
_CLOSING = Flag.END_HEADERS | Flag.END_STREAM
# Answers up to this size leave as one bytes object (frame headers, header blocks and payload
# joined): one allocation and one buffer for the write instead of five. Larger payloads are
# passed on as they are, never copied.
_JOIN_BELOW = 2048


class SendOwner(Protocol):
    """What the send side tells the engine."""

    def local_done(self, stream: Stream) -> None:
        """The stream's last frame left."""

    def grant(self, stream: Stream) -> None:
        """The stream's queue shrank: its receive window may reopen."""


class Outbound:
    """Frames to send, in order; payloads go out as the peer's windows allow.

    Everything written is kept in one list until :meth:`take`, so what a read (or one
    application call) produced leaves in one system call.

    Args:
        owner: the engine.
    """

    def __init__(self, owner: SendOwner) -> None:
        self._owner = owner
        self.out: list[bytes | memoryview] = []
        """Bytes to send, in order (the engine hands them over)."""
        self.window = DEFAULT_WINDOW
        """The connection-level window the peer has granted."""
        self.initial_window = DEFAULT_WINDOW
        """The peer's SETTINGS_INITIAL_WINDOW_SIZE: each new stream's send window."""
        self.max_frame = DEFAULT_MAX_FRAME_SIZE
        self.waiting = 0
        """DATA bytes of every stream waiting for the peer's windows (the sum of the streams'
        ``outbound_bytes``, kept as they change: read for every DATA frame received)."""
        # Streams whose queued payload waits: for the connection's window (a connection
        # WINDOW_UPDATE moves them) or for their own (only their own WINDOW_UPDATE or a larger
        # INITIAL_WINDOW_SIZE does). Kept apart, so a flood of one-byte connection updates
        # never walks streams that could not send anyway.
        self._blocked: dict[int, Stream] = {}
        self._starved: dict[int, Stream] = {}

    def write(self, data: bytes) -> None:
        self.out.append(data)

    # -- a stream's frames ----------------------------------------------------------------
    def answer(self, stream: Stream, headers: bytes, payload: bytes, trailers: bytes) -> bool:
        """A header block, one DATA payload and a closing header block.

        Returns True when all of it was written at once, which the windows and frame size allow
        for most answers: the stream is then done on our side and the caller (the engine)
        finishes it without a call back. False when the payload waits for window; then the
        owner hears of the end through :meth:`SendOwner.local_done`.
        """
        stream.local_closed = True
        size = len(payload)
        stream_id = stream.stream_id
        max_frame = self.max_frame
        if (
            size <= stream.send_window
            and size <= self.window
            and size <= max_frame
            and len(headers) <= max_frame
            and len(trailers) <= max_frame
        ):
            stream.send_window -= size
            self.window -= size
            length = len(headers)
            head = _PACK_HEADER(length >> 8, length & 0xFF, _HEADERS, _END_HEADERS, stream_id) + headers
            length = len(trailers)
            tail = _PACK_HEADER(length >> 8, length & 0xFF, _HEADERS, _CLOSING, stream_id) + trailers
            data = _PACK_HEADER(size >> 8, size & 0xFF, _DATA, 0, stream_id)
            if size < _JOIN_BELOW:
                self.out.append(b"".join((head, data, payload, tail)))
            else:
                self.out += (head, data, payload, tail)
            return True
        self.out.append(header_frames(stream_id, headers, False, max_frame))
        queue = _queue(stream)
        queue.append((payload, False))
        stream.outbound_bytes += size
        self.waiting += size
        queue.append((trailers, True))
        self.flush(stream)
        return False

    def headers(self, stream: Stream, block: bytes, end_stream: bool) -> None:
        """A header block now (headers never wait for window); ``end_stream`` ends our side."""
        if end_stream and stream.outbound:  # closing block: after the queued data
            stream.local_closed = True
            stream.outbound.append((block, True))
            self.flush(stream)
            return
        self.out.append(header_frames(stream.stream_id, block, end_stream, self.max_frame))
        if end_stream:
            stream.local_closed = True
            self._owner.local_done(stream)

    def data(self, stream: Stream, payload: bytes | memoryview) -> None:
        _queue(stream).append((payload, False))
        stream.outbound_bytes += len(payload)
        self.waiting += len(payload)
        self.flush(stream)

    def flush(self, stream: Stream) -> None:
        """Send what the windows allow of a stream's queued payloads, then its closing block."""
        outbound = stream.outbound
        while outbound:
            payload, closing = outbound[0]
            if closing:
                outbound.popleft()
                self.out.append(header_frames(stream.stream_id, bytes(payload), True, self.max_frame))
                self._unblock(stream)
                self._owner.local_done(stream)
                return
            room = min(stream.send_window, self.window, self.max_frame)
            if room <= 0:
                self._unblock(stream)
                waiting = self._starved if stream.send_window <= 0 else self._blocked
                waiting[stream.stream_id] = stream
                self._owner.grant(stream)
                return
            chunk = payload if len(payload) <= room else memoryview(payload)[:room]
            stream.send_window -= len(chunk)
            self.window -= len(chunk)
            stream.outbound_bytes -= len(chunk)
            self.waiting -= len(chunk)
            self.out.extend(data_frame(stream.stream_id, chunk, False))
            if len(chunk) == len(payload):
                outbound.popleft()
            else:
                outbound[0] = (memoryview(payload)[room:], False)
        self._unblock(stream)
        self._owner.grant(stream)

    # -- window changes ---------------------------------------------------------------
    def grow_connection_window(self, increment: int) -> None:
        """A WINDOW_UPDATE on stream 0.

        Raises:
            Http2Error: the window passed 2^31-1 (FLOW_CONTROL_ERROR).
        """
        self.window += increment
        if self.window > MAX_WINDOW:
            raise Http2Error(ErrorCode.FLOW_CONTROL_ERROR, "connection window overflow")
        self.flush_blocked()

    def _unblock(self, stream: Stream) -> None:
        self._blocked.pop(stream.stream_id, None)
        self._starved.pop(stream.stream_id, None)

    def flush_starved(self) -> None:
        """Send what grown stream windows (a larger INITIAL_WINDOW_SIZE) now allow."""
        for starved in list(self._starved.values()):
            self.flush(starved)

    def flush_blocked(self) -> None:
        """Send what grown windows now allow of the streams waiting for window (only those:
        a window change must not cost a walk over every open stream), until the connection's
        window is spent: a WINDOW_UPDATE of one byte moves one stream, not all of them."""
        if self.window <= 0:
            return
        for blocked in list(self._blocked.values()):
            self.flush(blocked)
            if self.window <= 0:
                return

    def grow_stream_window(self, stream: Stream, increment: int) -> bool:
        """A WINDOW_UPDATE on a stream; False when its window overflowed (reset it)."""
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            return False
        self.flush(stream)
        return True

    def set_initial_window(self, value: int, streams: Iterable[Stream]) -> bool:
        """The peer changed SETTINGS_INITIAL_WINDOW_SIZE to ``value`` (at most 2^31-1: the
        SETTINGS frame's entries are checked as they are read); True when stream windows grew.

        Raises:
            Http2Error: a stream's window after the change passed 2^31-1.
        """
        delta = value - self.initial_window
        self.initial_window = value
        for stream in streams:
            stream.send_window += delta
            if stream.send_window > MAX_WINDOW:
                raise Http2Error(ErrorCode.FLOW_CONTROL_ERROR, "a stream window overflowed")
        return delta > 0

    def forget(self, stream: Stream) -> None:
        """The stream was reset: drop what it still had to send."""
        stream.outbound = None
        self.waiting -= stream.outbound_bytes
        stream.outbound_bytes = 0
        self._unblock(stream)

    def clear(self) -> None:
        self._blocked.clear()
        self._starved.clear()
        self.waiting = 0


def _queue(stream: Stream) -> deque[tuple[bytes | memoryview, bool]]:
    """The stream's queue of payloads waiting for window, made on first use (most streams
    never wait)."""
    queue = stream.outbound
    if queue is None:
        queue = stream.outbound = deque()
    return queue
