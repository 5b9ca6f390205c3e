"""The gRPC listener: a grpc.aio server on the HTTP event loop, with health and reflection."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from ortserve.core.dataplane import DataPlane
from ortserve.protocol.grpc import grpc_service_pb2, grpc_service_pb2_grpc
from ortserve.protocol.tensors import TensorLimits
from ortserve.server.grpc.health import INFERENCE_SERVICE, ReadinessHealth
from ortserve.server.grpc.service import InferenceService
from ortserve.settings import ServerSettings
from ortserve.telemetry import Telemetry

__all__ = ["GrpcListener", "GrpcOptions"]

_HEALTH_SERVICE = "grpc.health.v1.Health"


@dataclass(frozen=True, slots=True)
class GrpcOptions:
    """Transport knobs of the gRPC listener (see :class:`~ortserve.settings.ServerSettings`)."""

    max_message_bytes: int
    keepalive_time_s: float
    keepalive_timeout_s: float
    max_concurrent_streams: int

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> GrpcOptions:
        message = settings.grpc_max_message_bytes
        return cls(
            max_message_bytes=settings.max_body_bytes if message is None else message,
            keepalive_time_s=settings.grpc_keepalive_time_s,
            keepalive_timeout_s=settings.grpc_keepalive_timeout_s,
            max_concurrent_streams=settings.grpc_max_concurrent_streams,
        )

    def channel_args(self) -> list[tuple[str, int]]:
        """grpc core server arguments."""
        return [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_concurrent_streams", self.max_concurrent_streams),
            ("grpc.keepalive_time_ms", round(self.keepalive_time_s * 1000)),
            ("grpc.keepalive_timeout_ms", round(self.keepalive_timeout_s * 1000)),
            # Clients may ping idle connections every 10 s without being told "too many pings".
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
            ("grpc.http2.max_ping_strikes", 2),
            # Fail loudly when the port is taken instead of sharing it with another process.
            ("grpc.so_reuseport", 0),
        ]


def _reflection_pool() -> descriptor_pool.DescriptorPool:
    """One pool holding every served file (the inference stubs use a private pool)."""
    pool = descriptor_pool.DescriptorPool()
    for module in (grpc_service_pb2, health_pb2, reflection_pb2):
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    return pool


class GrpcListener:
    """Serves inference.GRPCInferenceService, grpc.health.v1 and server reflection.

    The grpc.aio server is created in :meth:`start`, on the running (uvloop) event loop that
    HTTP uses, so both transports share the DataPlane's schedulers without crossing threads.

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
        self._server: grpc.aio.Server | None = None
        self._stopping: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (useful with port 0).

        Raises:
            OSError: the address cannot be bound.
        """
        server = grpc.aio.server(options=self._options.channel_args())
        grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(  # type: ignore[no-untyped-call]
            self.service, server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (INFERENCE_SERVICE, _HEALTH_SERVICE, reflection.SERVICE_NAME), server, _reflection_pool()
        )
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(f"gRPC cannot listen on {address}: {exc}") from None
        if not bound:
            raise OSError(f"gRPC cannot listen on {address}")
        await server.start()
        self._server = server
        return int(bound)

    def readiness_changed(self) -> None:
        """Tell health watchers to re-read readiness (after loading, on drain)."""
        self.health.notify()

    def stop_accepting(self, grace_s: float) -> None:
        """Refuse new calls, end health watches and stream reading; calls in flight get ``grace_s``."""
        self.health.close()
        self.service.drain()
        if self._server is not None and self._stopping is None:
            self._stopping = asyncio.create_task(self._server.stop(grace_s))

    async def wait_closed(self) -> None:
        """Wait until every call has ended (or was cancelled when the grace period ran out)."""
        if self._stopping is not None:
            await self._stopping
