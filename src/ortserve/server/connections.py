"""What the HTTP and gRPC listeners share: binding a socket, and the set of open connections."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["ConnectionSet", "listen"]

_C = TypeVar("_C")


class ConnectionSet(Generic[_C]):
    """Connections join on connect and leave on close; once ``closing``, the last one to leave
    sets ``all_closed``. Shared by the HTTP and gRPC listeners."""

    def __init__(self) -> None:
        self.connections: set[_C] = set()
        self.closing = False
        self.all_closed = asyncio.Event()

    def discard(self, connection: _C) -> None:
        self.connections.discard(connection)
        if self.closing and not self.connections:
            self.all_closed.set()


async def listen(protocol: Callable[[], asyncio.Protocol], host: str, port: int) -> asyncio.Server:
    """Bind ``host:port`` (port 0 picks one) with a deep backlog and Nagle off on TCP sockets.

    Raises:
        OSError: the address cannot be bound.
    """
    loop = asyncio.get_running_loop()
    server = await loop.create_server(protocol, host, port, reuse_address=True, backlog=2048)
    for sock in server.sockets:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return server
