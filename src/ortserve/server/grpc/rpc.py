"""What a gRPC method is to the server: its request type, its handler (unary or streaming), and
the shapes a handler's answer may take.

The router maps each method path to an :class:`Rpc`; a call (:mod:`~ortserve.server.grpc.call`)
runs it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeVar

from google.protobuf.message import Message

if TYPE_CHECKING:
    from ortserve.server.grpc.call import GrpcCall

__all__ = ["Deferred", "EdgeRefusal", "Rpc", "StreamHandler", "UnaryHandler", "UnaryResult"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Deferred(Generic[_T]):
    """A unary answer still being computed: ``finish`` turns the settled future into the reply."""

    pending: asyncio.Future[_T]
    finish: Callable[[asyncio.Future[_T]], Message]


UnaryResult: TypeAlias = "Message | Deferred[Any] | Coroutine[Any, Any, Message]"
# Handlers are typed by their request message; the router only knows it as a Message.
UnaryHandler: TypeAlias = Callable[[Any, "GrpcCall"], UnaryResult]
StreamHandler: TypeAlias = Callable[["GrpcCall"], Coroutine[Any, Any, None]]


EdgeRefusal: TypeAlias = Callable[[bytes | bytearray | memoryview], "bytes | bool"]
"""A unary request's raw message -> a trailers-only header block that refuses it, or whether
the edge asked (True: asked, and no load refusal applies, so the handler need not ask again
before decoding; False: not asked, e.g. the message could not be peeked)."""


@dataclass(frozen=True, slots=True)
class Rpc:
    """One method: its request type and either a unary or a streaming handler.

    ``refuse`` (unary only) sees the message before it is parsed: under overload it answers
    from the message's first bytes, and the message is never decoded.
    """

    request_type: type[Message]
    unary: UnaryHandler | None = None
    streaming: StreamHandler | None = None
    refuse: EdgeRefusal | None = None
