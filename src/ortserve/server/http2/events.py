"""What the engine tells its application after reading bytes: one event per thing that happened.

Plain slotted classes rather than dataclasses: a unary call makes two of them, and their
construction is on every call's path.
"""

from __future__ import annotations

from typing import Generic, TypeAlias, TypeVar

from ortserve.server.http2.frames import ErrorCode

__all__ = ["ConnectionEnded", "DataReceived", "Event", "RequestReceived", "StreamReset", "reset_by_peer"]

_H = TypeVar("_H")


class RequestReceived(Generic[_H]):
    """A stream opened with a valid request head (the application's interpretation of it)."""

    __slots__ = ("end_stream", "head", "stream_id")

    def __init__(self, stream_id: int, head: _H, end_stream: bool) -> None:
        self.stream_id = stream_id
        self.head = head
        self.end_stream = end_stream

    def __repr__(self) -> str:
        return f"RequestReceived({self.stream_id}, end_stream={self.end_stream})"


class DataReceived:
    """Request body bytes (padding removed), or the end of the request.

    ``data`` is a view of the bytes read: copy what must outlive the event's handling. Request
    trailers arrive as an empty ``data`` with ``end_stream`` set. Until the application calls
    :meth:`~ortserve.server.http2.engine.Http2Engine.consumed`, the stream's receive window
    stays as the data left it.
    """

    __slots__ = ("data", "end_stream", "stream_id")

    def __init__(self, stream_id: int, data: memoryview, end_stream: bool) -> None:
        self.stream_id = stream_id
        self.data = data
        self.end_stream = end_stream

    def __repr__(self) -> str:
        return f"DataReceived({self.stream_id}, {len(self.data)} bytes, end_stream={self.end_stream})"


class StreamReset:
    """A stream the application knows ended abnormally: the peer reset it (``remote``), or the
    engine did for a stream error. Nothing more is sent on it."""

    __slots__ = ("code", "remote", "stream_id")

    def __init__(self, stream_id: int, code: ErrorCode, remote: bool) -> None:
        self.stream_id = stream_id
        self.code = code
        self.remote = remote

    def __repr__(self) -> str:
        return f"StreamReset({self.stream_id}, {self.code.name}, remote={self.remote})"


class ConnectionEnded:
    """The connection failed (GOAWAY with ``code`` is queued) or the peer stopped answering:
    every stream is gone, and the transport should close once the queued bytes are sent."""

    __slots__ = ("code", "message")

    def __init__(self, code: ErrorCode, message: str) -> None:
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"ConnectionEnded({self.code.name}, {self.message!r})"


Event: TypeAlias = "RequestReceived[_H] | DataReceived | StreamReset | ConnectionEnded"


def reset_by_peer(events: list[Event[_H]]) -> frozenset[int]:
    """The streams the peer reset among one read's events."""
    return frozenset(e.stream_id for e in events if type(e) is StreamReset and e.remote)
