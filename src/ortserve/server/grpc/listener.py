"""The gRPC listener: binds the socket, serves HTTP/2 connections, drains them on shutdown."""

from __future__ import annotations

import asyncio
import contextlib

from ortserve.core.dataplane import DataPlane
from ortserve.protocol.tensors import TensorLimits
from ortserve.server.connections import ConnectionSet, listen
from ortserve.server.grpc.call import Rpc
from ortserve.server.grpc.connection import Http2Connection
from ortserve.server.grpc.health import ReadinessHealth
from ortserve.server.grpc.options import GrpcOptions
from ortserve.server.grpc.reflection import Reflection
from ortserve.server.grpc.service import InferenceService
from ortserve.telemetry import Telemetry

__all__ = ["GrpcListener", "GrpcOptions"]


class GrpcListener:
    """Serves inference.GRPCInferenceService, grpc.health.v1 and server reflection.

    Connections run on the event loop HTTP uses, so both transports share the DataPlane's
    schedulers without crossing threads.

    Args:
        dataplane: the server's one DataPlane.
        limits: tensor limits applied while decoding.
        options: message size, keepalive and stream limits.
        telemetry: request accounting shared with HTTP (statistics, metrics, traces).
    """

    def __init__(
        self,
        dataplane: DataPlane,
        limits: TensorLimits,
        options: GrpcOptions,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._options = options
        self.service = InferenceService(dataplane, limits, telemetry)
        self.health = ReadinessHealth(dataplane)
        self._routes: dict[str, Rpc] = {
            **self.service.routes(),
            **self.health.routes(),
            **Reflection().routes(),
        }
        self._connections: ConnectionSet[Http2Connection] = ConnectionSet()
        self._server: asyncio.Server | None = None
        self._grace: asyncio.TimerHandle | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (useful with port 0).

        Raises:
            OSError: the address cannot be bound.
        """
        loop = asyncio.get_running_loop()
        try:
            self._server = await listen(
                lambda: Http2Connection(self._routes, self._options, self._connections, loop), host, port
            )
        except OSError as exc:
            raise OSError(exc.errno, f"gRPC cannot listen on {host}:{port}: {exc.strerror}") from None
        return int(self._server.sockets[0].getsockname()[1])

    def readiness_changed(self) -> None:
        """Tell health watchers to re-read readiness (after loading, on drain)."""
        self.health.notify()

    def stop_accepting(self, grace_s: float) -> None:
        """Refuse new connections and calls; calls in flight get ``grace_s`` to finish."""
        self.health.close()
        self._connections.closing = True
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections.connections):
            connection.go_away()
        if self._grace is None:
            self._grace = asyncio.get_running_loop().call_later(grace_s, self._abort_all)

    def _abort_all(self) -> None:
        for connection in list(self._connections.connections):
            connection.abort()

    async def wait_closed(self) -> None:
        """Wait until every connection has closed (at the latest when the grace period ends)."""
        if self._connections.connections:
            await self._connections.all_closed.wait()
        if self._grace is not None:
            self._grace.cancel()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
