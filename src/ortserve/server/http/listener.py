"""The HTTP listener: binds the socket, owns its connections, and drains them on shutdown."""

from __future__ import annotations

import asyncio

from ortserve.server.connections import ConnectionSet, listen
from ortserve.server.http.connection import ConnectionLimits, Handler, HttpConnection

__all__ = ["HttpListener"]


class HttpListener:
    """One listening socket serving :class:`HttpConnection` protocols.

    Args:
        handler: the route handler (an :class:`~ortserve.server.http.app.HttpApp`).
        limits: per-connection bounds.
    """

    def __init__(self, handler: Handler, limits: ConnectionLimits) -> None:
        self._handler = handler
        self._limits = limits
        self._state: ConnectionSet[HttpConnection] = ConnectionSet()
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (useful with port 0)."""
        loop = asyncio.get_running_loop()
        self._server = await listen(
            lambda: HttpConnection(self._handler, self._limits, self._state, loop), host, port
        )
        return int(self._server.sockets[0].getsockname()[1])

    def stop_accepting(self) -> None:
        """Close the listening socket and every idle connection; busy ones close after answering."""
        self._state.closing = True
        if self._server is not None:
            self._server.close()
        for connection in list(self._state.connections):
            connection.close_if_idle()

    async def wait_closed(self, timeout_s: float) -> None:
        """Wait for busy connections to answer and close, up to ``timeout_s``."""
        if not self._state.connections:
            return
        try:
            await asyncio.wait_for(self._state.all_closed.wait(), timeout_s)
        except TimeoutError:
            for connection in list(self._state.connections):
                connection.abort()
