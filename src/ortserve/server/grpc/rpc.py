"""What a gRPC method is to the server: its request type, its handler (unary or streaming), and
the shapes a handler's answer may take.

The router maps each method path to an :class:`Rpc`; a call (:mod:`~ortserve.server.grpc.call`)
runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from google.protobuf.message import Message

from ortserve.server.deferred import Deferred

if TYPE_CHECKING:
    from ortserve.server.grpc.call import GrpcCall

__all__ = ["CallMetadata", "Deferred", "EdgeRefusal", "Rpc", "StreamHandler", "UnaryHandler", "UnaryResult"]

UnaryResult: TypeAlias = "Message | Deferred[Message] | Coroutine[Any, Any, Message]"
"""A unary handler's answer: a reply now, one a future will finish (the server's one
:class:`~ortserve.server.deferred.Deferred`: no task per call), or a coroutine."""
# Handlers are typed by their request message; the router only knows it as a Message.
UnaryHandler: TypeAlias = Callable[[Any, "GrpcCall"], UnaryResult]
StreamHandler: TypeAlias = Callable[["GrpcCall"], Coroutine[Any, Any, None]]


class CallMetadata(Protocol):
    """What an edge refusal reads of a call: its metadata (a call's, or its head's before
    the call exists)."""

    def metadata_value(self, name: str) -> str | None:
        """The first value of a metadata key (lowercase); None when the call has none."""
        ...


EdgeRefusal: TypeAlias = Callable[[bytes | bytearray | memoryview, CallMetadata], "bytes | bool"]
"""A unary request's raw message (and its call's metadata) -> a trailers-only header block
that refuses it, or whether
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
