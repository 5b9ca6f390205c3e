"""The gRPC listener: binds the socket, serves HTTP/2 connections, drains them on shutdown."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping

from google.protobuf import empty_pb2
from google.protobuf.message import Message

from ortserve.core.dataplane import DataPlane
from ortserve.protocol.tensors import TensorLimits
from ortserve.server.connections import (
    ByteBudget,
    ConnectionLimit,
    ConnectionSet,
    FirstBytesGate,
    Refusal,
    listen,
)
from ortserve.server.exchange import Exchange
from ortserve.server.grpc.app_services import AppServices
from ortserve.server.grpc.call import GrpcCall
from ortserve.server.grpc.connection import Http2Connection
from ortserve.server.grpc.errors import GrpcAbort, StatusCode
from ortserve.server.grpc.health import ReadinessHealth
from ortserve.server.grpc.inflate import Inflater
from ortserve.server.grpc.options import GrpcOptions
from ortserve.server.grpc.reflection import Reflection
from ortserve.server.grpc.rpc import Rpc
from ortserve.server.grpc.service import InferenceService
from ortserve.server.http.run_queue import run_queue_of
from ortserve.server.http2.frames import ErrorCode, goaway_frame, settings_frame
from ortserve.server.intake import IntakeGovernor
from ortserve.telemetry import Telemetry

__all__ = ["GrpcListener", "GrpcOptions"]

# Long enough for a loaded client to send its first call (GOAWAY before it would make the
# client retry elsewhere instead of failing); at most _MAX_REFUSING such connections live, and
# they make room for one another as connections under the cap do (a silent one first).
_REFUSAL_LINGER_S = 5.0
_MAX_REFUSING = 256
_GOAWAY = settings_frame({}) + goaway_frame(0, ErrorCode.REFUSED_STREAM, "too many connections")
_PEER_GOAWAY = settings_frame({}) + goaway_frame(
    0, ErrorCode.ENHANCE_YOUR_CALM, "too many connections from this address"
)
PROBES = (
    "/inference.GRPCInferenceService/ServerLive",
    "/inference.GRPCInferenceService/ServerReady",
    "/grpc.health.v1.Health/Check",
)
"""Methods answered even over the connection cap: an orchestrator's probes."""


def _refuse(request: Message, call: GrpcCall) -> Message:
    raise GrpcAbort(StatusCode.UNAVAILABLE, "too many connections")


class _ProbesOnly(Mapping[str, Rpc]):
    """The routes of a connection over the cap: health probes (:data:`PROBES`) are answered,
    every other method answers UNAVAILABLE.

    A GOAWAY or a stream reset would be cleaner on the wire, but gRPC clients retry those
    transparently on a new connection until their deadline, so the caller would wait; a
    status ends the call at once.
    """

    _rpc = Rpc(empty_pb2.Empty, unary=_refuse)

    def __init__(self, routes: Mapping[str, Rpc]) -> None:
        self._probes = {path: routes[path] for path in PROBES if path in routes}

    def __getitem__(self, path: str) -> Rpc:
        return self._probes.get(path, self._rpc)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


class GrpcListener:
    """Serves inference.GRPCInferenceService, grpc.health.v1 and server reflection.

    Connections run on the event loop HTTP uses, so both transports share the DataPlane's
    schedulers without crossing threads.

    Args:
        dataplane: the server's one DataPlane.
        limits: tensor limits applied while decoding.
        options: message size, keepalive and stream limits.
        telemetry: request accounting shared with HTTP (statistics, metrics, traces).
        connection_limit: the cap on open connections, shared with the HTTP listener (None:
            no cap). A connection that has sent nothing yet may be evicted for a new one.
        intake: parks connections while the loop is saturated (shared with HTTP).
        budget: the server-wide bound on request bytes held (``--max-inflight-bytes``,
            shared with HTTP): a call whose message would pass it ends RESOURCE_EXHAUSTED.
        exchange: the server's one request edge, shared with HTTP (capture, routing).
    """

    def __init__(
        self,
        dataplane: DataPlane,
        limits: TensorLimits,
        options: GrpcOptions,
        telemetry: Telemetry | None = None,
        connection_limit: ConnectionLimit | None = None,
        intake: IntakeGovernor | None = None,
        budget: ByteBudget | None = None,
        exchange: Exchange | None = None,
    ) -> None:
        self._options = options
        self._budget = budget
        self.service = InferenceService(dataplane, limits, telemetry, exchange)
        self.health = ReadinessHealth(dataplane)
        self._routes: dict[str, Rpc] = {
            **self.service.routes(),
            **AppServices(self.service.exchange).routes(),
            **self.health.routes(),
            **Reflection().routes(),
        }
        self._connections: ConnectionSet[Http2Connection] = ConnectionSet(connection_limit, intake)
        self._refused: ConnectionSet[Http2Connection] = ConnectionSet(ConnectionLimit(_MAX_REFUSING))
        self._probes_only = _ProbesOnly(self._routes)
        self._server: asyncio.Server | None = None
        self._grace: asyncio.TimerHandle | None = None
        self.reuse_port = False
        """Bind with SO_REUSEPORT (the workers of ``--workers N`` share the port)."""

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (useful with port 0).

        Raises:
            OSError: the address cannot be bound.
        """
        loop = asyncio.get_running_loop()
        inflater = Inflater(loop)
        runs = run_queue_of(loop)  # HTTP's: admitted calls of both transports run after the reads

        def accept() -> asyncio.Protocol:
            if not self._connections.limit.admit():
                return self._refusal(loop, inflater)
            connection = Http2Connection(
                self._routes, self._options, self._connections, loop, inflater, self._budget, runs
            )
            return FirstBytesGate(connection, self._connections, _PEER_GOAWAY)

        try:
            self._server = await listen(accept, host, port, self.reuse_port)
        except OSError as exc:
            raise OSError(exc.errno, f"gRPC cannot listen on {host}:{port}: {exc.strerror}") from None
        return int(self._server.sockets[0].getsockname()[1])

    def _refusal(self, loop: asyncio.AbstractEventLoop, inflater: Inflater) -> asyncio.Protocol:
        """A connection over the cap: probes answered, other calls UNAVAILABLE, GOAWAY after 5 s.

        At most ``_MAX_REFUSING`` such connections live at once (a silent or answered one
        makes room for a new one); past that, a refusal is the server preface and GOAWAY, then
        close (the client retries until its deadline).
        """
        if not self._refused.limit.admit():
            return Refusal(_GOAWAY, self._connections.limit)
        connection = Http2Connection(self._probes_only, self._options, self._refused, loop, inflater)
        loop.call_later(_REFUSAL_LINGER_S, connection.go_away)  # a no-op once it has closed
        return FirstBytesGate(connection, self._refused)

    def readiness_changed(self) -> None:
        """Tell health watchers to re-read readiness (after loading, on drain)."""
        self.health.notify()

    def stop_accepting(self, grace_s: float) -> None:
        """Refuse new connections and calls; calls in flight get ``grace_s`` to finish."""
        self.health.close()
        self._connections.closing = True
        if self._server is not None:
            self._server.close()
        for connection in [*self._connections.connections, *self._refused.connections]:
            connection.go_away()
        if self._grace is None:
            self._grace = asyncio.get_running_loop().call_later(grace_s, self._abort_all)

    def _abort_all(self) -> None:
        for connection in [*self._connections.connections, *self._refused.connections]:
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
