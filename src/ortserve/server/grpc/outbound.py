"""The send side of one HTTP/2 connection: the peer's flow-control windows, its frame size, and
answers waiting for window. It is the :class:`~ortserve.server.grpc.call.CallOwner` of every call."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from ortserve.server.grpc.call import GrpcCall
from ortserve.server.grpc.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_WINDOW,
    MAX_WINDOW,
    ErrorCode,
    Flag,
    FrameType,
    Http2Error,
    data_frame,
    frame,
    header_frames,
)
from ortserve.server.grpc.headers import RESPONSE_HEADERS, trailers

__all__ = ["Outbound", "StreamOwner"]


class StreamOwner(Protocol):
    """What the send side needs from its connection."""

    @property
    def closed(self) -> bool:
        """The connection is closed: nothing more is written."""

    def write(self, data: bytes) -> None: ...

    def write_many(self, chunks: list[bytes | memoryview]) -> None: ...

    def local_done(self, call: GrpcCall) -> None:
        """The call's answer is complete (trailers written)."""

    def grant(self, call: GrpcCall) -> None:
        """The call may be able to take more request data: reopen its receive window."""


class Outbound:
    """Writes answers as the peer's windows allow; a call blocked on window waits here.

    Args:
        owner: the connection.
    """

    def __init__(self, owner: StreamOwner) -> None:
        self._owner = owner
        self.window = DEFAULT_WINDOW
        """The connection-level window the peer has granted."""
        self.initial_window = DEFAULT_WINDOW
        """The peer's SETTINGS_INITIAL_WINDOW_SIZE: each new stream's send window."""
        self.max_frame = DEFAULT_MAX_FRAME_SIZE
        self._blocked: dict[int, GrpcCall] = {}

    # -- CallOwner --------------------------------------------------------------------
    def send_answer(self, call: GrpcCall, payload: bytes) -> None:
        """Headers, one message and OK trailers; one write when the windows allow."""
        if call.local_closed or self._owner.closed:
            return
        call.headers_sent = True
        call.local_closed = True
        size = len(payload)
        stream_id = call.stream_id
        if size <= call.send_window and size <= self.window and size <= self.max_frame:
            call.send_window -= size
            self.window -= size
            header, data = data_frame(stream_id, payload, False)
            self._owner.write_many(
                [
                    frame(FrameType.HEADERS, Flag.END_HEADERS, stream_id, RESPONSE_HEADERS),
                    header,
                    data,
                    frame(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, stream_id, trailers(0)),
                ]
            )
            self._owner.local_done(call)
            return
        self._owner.write(frame(FrameType.HEADERS, Flag.END_HEADERS, stream_id, RESPONSE_HEADERS))
        call.outbound.append((payload, False))
        call.outbound_bytes += size
        call.outbound.append((trailers(0), True))
        self.flush(call)

    def send_headers(self, call: GrpcCall, block: bytes) -> None:
        if call.local_closed or self._owner.closed:
            return
        call.headers_sent = True
        self._owner.write(header_frames(call.stream_id, block, False, self.max_frame))

    def send_message(self, call: GrpcCall, payload: bytes) -> None:
        if call.local_closed or self._owner.closed:
            return
        call.outbound.append((payload, False))
        call.outbound_bytes += len(payload)
        self.flush(call)

    def send_trailers(self, call: GrpcCall, block: bytes) -> None:
        if call.local_closed or self._owner.closed:
            return
        call.headers_sent = True
        call.local_closed = True
        call.outbound.append((block, True))
        self.flush(call)

    def drained(self, call: GrpcCall) -> None:
        self._owner.grant(call)

    # -- window changes ---------------------------------------------------------------
    def flush(self, call: GrpcCall) -> None:
        """Send what the windows allow of a stream's queued messages, then its trailers."""
        outbound = call.outbound
        while outbound:
            payload, is_trailers = outbound[0]
            if is_trailers:
                outbound.popleft()
                self._owner.write(header_frames(call.stream_id, bytes(payload), True, self.max_frame))
                self._blocked.pop(call.stream_id, None)
                self._owner.local_done(call)
                return
            room = min(call.send_window, self.window, self.max_frame)
            if room <= 0:
                self._blocked[call.stream_id] = call
                self._owner.grant(call)
                return
            chunk = payload if len(payload) <= room else memoryview(payload)[:room]
            call.send_window -= len(chunk)
            self.window -= len(chunk)
            call.outbound_bytes -= len(chunk)
            self._owner.write_many(data_frame(call.stream_id, chunk, False))
            if len(chunk) == len(payload):
                outbound.popleft()
            else:
                outbound[0] = (memoryview(payload)[room:], False)
        self._blocked.pop(call.stream_id, None)
        self._owner.grant(call)

    def grow_connection_window(self, increment: int) -> None:
        """A WINDOW_UPDATE on stream 0.

        Raises:
            Http2Error: the window passed 2^31-1 (FLOW_CONTROL_ERROR).
        """
        self.window += increment
        if self.window > MAX_WINDOW:
            raise Http2Error(ErrorCode.FLOW_CONTROL_ERROR, "connection window overflow")
        for blocked in list(self._blocked.values()):
            self.flush(blocked)

    def grow_stream_window(self, call: GrpcCall, increment: int) -> bool:
        """A WINDOW_UPDATE on a call's stream; False when its window overflowed (reset it)."""
        call.send_window += increment
        if call.send_window > MAX_WINDOW:
            return False
        self.flush(call)
        return True

    def set_initial_window(self, value: int, calls: Iterable[GrpcCall]) -> bool:
        """The peer changed SETTINGS_INITIAL_WINDOW_SIZE; True when stream windows grew.

        Raises:
            Http2Error: the value, or a stream's window after the change, passed 2^31-1.
        """
        if value > MAX_WINDOW:
            raise Http2Error(ErrorCode.FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE too large")
        delta = value - self.initial_window
        self.initial_window = value
        for call in calls:
            call.send_window += delta
            if call.send_window > MAX_WINDOW:
                raise Http2Error(ErrorCode.FLOW_CONTROL_ERROR, "a stream window overflowed")
        return delta > 0

    def forget(self, call: GrpcCall) -> None:
        """The call ended or was reset: it waits for window no more."""
        self._blocked.pop(call.stream_id, None)

    def clear(self) -> None:
        self._blocked.clear()
