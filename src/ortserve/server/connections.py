"""The open connections of one listener, so shutdown can close them and wait until they are gone."""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

__all__ = ["ConnectionSet"]

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
