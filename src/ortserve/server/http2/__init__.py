"""A server-side HTTP/2 engine without I/O: bytes in, events and bytes out (RFC 9113, RFC 7541).

It imports nothing from asyncio or gRPC; ``server/grpc/connection.py`` is its asyncio adapter.
"""

from __future__ import annotations

from ortserve.server.http2.config import EngineConfig
from ortserve.server.http2.engine import Http2Engine
from ortserve.server.http2.events import ConnectionEnded, DataReceived, Event, RequestReceived, StreamReset
from ortserve.server.http2.frames import ErrorCode
from ortserve.server.http2.headers import Fields, MalformedHeaders

__all__ = [
    "ConnectionEnded",
    "DataReceived",
    "EngineConfig",
    "ErrorCode",
    "Event",
    "Fields",
    "Http2Engine",
    "MalformedHeaders",
    "RequestReceived",
    "StreamReset",
]
