"""What the HTTP and gRPC listeners share: binding a socket, the set of open connections, the
server-wide bound on connections, and the server-wide bound on request bytes held."""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ortserve.server.connection_limit import ConnectionLimit, Evictable, peer_address
from ortserve.server.intake import IntakeGovernor
from ortserve.server.memory import HeapTrimmer

__all__ = [
    "ByteBudget",
    "ConnectionLimit",
    "ConnectionSet",
    "Evictable",
    "FirstBytesGate",
    "Refusal",
    "connection_cap",
    "listen",
    "peer_address",
]

logger = logging.getLogger(__name__)

_C = TypeVar("_C")
_FD_RESERVE = 128  # descriptors kept for model files, logs, the metrics listener, pipes
_REFUSAL_LINGER_S = 1.0
_TRIM_WORTHY = 64 * 1024  # smaller bodies live in pymalloc's pools or reused heap chunks
_MAX_LINGERING = 1024  # refused sockets lingering at once; past it they are closed at once


def connection_cap(requested: int) -> int:
    """``requested``, lowered to what the process's descriptor limit (``ulimit -n``) allows.

    Past that limit ``accept`` fails and the loop stops accepting for a while, so every client
    would wait; below it, connections over the cap get a clear refusal instead.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return requested
    allowed = max(1, soft - _FD_RESERVE)
    if requested > allowed:
        logger.warning(
            "--max-connections %d lowered to %d: the open-file limit is %d (raise ulimit -n)",
            requested,
            allowed,
            soft,
        )
        return allowed
    return requested


class ConnectionSet(Generic[_C]):
    """Connections join on connect and leave on close; once ``closing``, the last one to leave
    sets ``all_closed``. Leaving gives the connection's place back to the shared limit.
    ``intake`` is the server-wide governor that parks connections while the loop is
    saturated (``server/intake.py``)."""

    def __init__(self, limit: ConnectionLimit | None = None, intake: IntakeGovernor | None = None) -> None:
        self.connections: set[_C] = set()
        self.closing = False
        self.all_closed = asyncio.Event()
        self.limit = limit if limit is not None else ConnectionLimit(1 << 62)
        self.intake = intake if intake is not None else IntakeGovernor(0.0)

    def discard(self, connection: _C) -> None:
        if connection in self.connections:
            self.connections.remove(connection)
            self.limit.leave(connection)
        if self.closing and not self.connections:
            self.all_closed.set()


class ByteBudget:
    """Request bytes the server holds across all connections, against one bound.

    Transports take bytes as they buffer them and give them back once the request is
    answered or its connection drops; a request that does not fit is refused (429).

    Args:
        limit: the most bytes held at once.
        trimmer: told of every release, so the heap pages go back to the system too.
    """

    def __init__(self, limit: int, trimmer: HeapTrimmer | None = None) -> None:
        self.limit = limit
        self.held = 0
        self._trimmer = trimmer

    def fits(self, size: int) -> bool:
        """Whether ``size`` more bytes would stay within the bound (nothing is taken)."""
        return self.held + size <= self.limit

    def take(self, size: int) -> bool:
        """Hold ``size`` more bytes; False (nothing taken) if that would pass the bound."""
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size
        if size >= _TRIM_WORTHY:
            self.freed(size)

    def freed(self, size: int) -> None:
        """``size`` bytes of request data were released (a body's pieces once joined, say)."""
        if self._trimmer is not None:
            self._trimmer.freed(size)


class Refusal(asyncio.Protocol):
    """A connection over the cap: write ``answer``, half-close, drop what the peer sends.

    Closing straight after writing would make the kernel reset the connection if the
    client's request arrives afterwards, and a reset can destroy the answer before the client
    reads it; so the socket lingers (at most ``_REFUSAL_LINGER_S``) until the client closes.
    Lingering sockets are bounded too: past ``_MAX_LINGERING`` a refusal closes at once.

    Args:
        answer: the bytes that say no (an HTTP 503, say).
        limit: the cap whose ``lingering`` count this refusal is part of.
    """

    def __init__(self, answer: bytes, limit: ConnectionLimit) -> None:
        self._answer = answer
        self._limit = limit
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream: asyncio.Transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport
        stream.write(self._answer)
        if self._limit.lingering >= _MAX_LINGERING or not stream.can_write_eof():
            stream.close()
            return
        self._limit.lingering += 1
        stream.write_eof()
        self._timer = asyncio.get_running_loop().call_later(_REFUSAL_LINGER_S, stream.abort)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._limit.lingering -= 1


class FirstBytesGate(asyncio.Protocol):
    """Stands in front of a connection's protocol until the peer sends its first bytes.

    Until then the connection is waiting for its first request as far as the
    :class:`ConnectionLimit` knows, so a socket that connects and says nothing can be evicted
    for a real client; the first bytes
    hand the transport to ``inner`` (``set_protocol``), which then costs nothing more. For
    protocols that cannot report idleness themselves (the gRPC connection).

    Args:
        inner: the protocol that serves the connection; it joins ``connections`` itself.
        connections: the listener's set, whose limit may evict this connection.
        peer_refusal: written, before closing, to a connection whose peer address holds its
            share of the limit already (``ConnectionLimit.per_peer``).
    """

    received = 0  # bytes the inner protocol has not been given: none, by definition

    def __init__(
        self, inner: asyncio.Protocol, connections: ConnectionSet[Any], peer_refusal: bytes = b""
    ) -> None:
        self._inner = inner
        self._connections = connections
        self._peer_refusal = peer_refusal
        self._transport: asyncio.Transport | None = None
        self._evicted = False  # before the inner protocol saw the connection: it never will
        # From the listener's accept on (a burst may be accepted before connection_made runs);
        # the inner protocol joins again in its connection_made, which changes nothing. It
        # ranks with the requests arriving (its first is to come), so a burst of new clients
        # closes the oldest stalled connections rather than one another.
        connections.connections.add(inner)
        connections.limit.receiving(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport
        if self._evicted:
            transport.close()
            return
        if not self._connections.limit.join_peer(self._inner, peer_address(transport)):
            self._evicted = True
            self._connections.limit.busy(self)
            self._connections.discard(self._inner)
            transport.write(self._peer_refusal)  # type: ignore[attr-defined]
            transport.close()  # after what was written
            return
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._connections.limit.busy(self)
        if self._transport is not None:
            self._transport.set_protocol(self._inner)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.limit.busy(self)
        if not self._evicted:
            self._inner.connection_lost(exc)

    def evict(self) -> None:
        """The cap needs this silent connection's place: give it back now and close."""
        self._connections.limit.busy(self)
        self._connections.discard(self._inner)
        if self._transport is None:
            self._evicted = True  # connection_made will close it without the inner protocol
        else:
            self._transport.close()


async def listen(
    protocol: Callable[[], asyncio.Protocol], host: str, port: int, reuse_port: bool = False
) -> asyncio.Server:
    """Bind ``host:port`` (port 0 picks one) with a deep backlog and Nagle off on TCP sockets.

    ``reuse_port``: SO_REUSEPORT, so the worker processes of ``--workers N`` each listen on the
    same port and the kernel spreads new connections over them.

    Raises:
        OSError: the address cannot be bound.
    """
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        protocol, host, port, reuse_address=True, reuse_port=reuse_port or None, backlog=2048
    )
    for sock in server.sockets:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return server
