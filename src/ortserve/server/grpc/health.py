"""grpc.health.v1 answered from the DataPlane's readiness, for load balancers and probes."""

from __future__ import annotations

import asyncio
from typing import TypeAlias

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ortserve.core.dataplane import DataPlane
from ortserve.errors import ModelNotFound

__all__ = ["INFERENCE_SERVICE", "ReadinessHealth"]

INFERENCE_SERVICE = "inference.GRPCInferenceService"
_SERVING: int = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING: int = health_pb2.HealthCheckResponse.NOT_SERVING
_SERVICE_UNKNOWN: int = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN

Context: TypeAlias = grpc.aio.ServicerContext


class ReadinessHealth(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """Health of the server ("" or the inference service) or of one model (its name).

    ``Check`` reads readiness at call time; ``Watch`` sends the status again whenever
    :meth:`notify` says it may have changed (models loaded, drain began), and ends on drain.

    Args:
        dataplane: whose readiness is reported.
    """

    def __init__(self, dataplane: DataPlane) -> None:
        self._dataplane = dataplane
        self._changed = asyncio.Event()
        self._closed = False

    def status(self, service: str) -> int:
        """The ServingStatus of a service name (SERVICE_UNKNOWN for one never served)."""
        if service in ("", INFERENCE_SERVICE):
            return _SERVING if self._dataplane.ready() else _NOT_SERVING
        try:
            return _SERVING if self._dataplane.model_ready(service) else _NOT_SERVING
        except ModelNotFound:
            return _SERVICE_UNKNOWN

    def notify(self) -> None:
        """Readiness may have changed: every Watch re-reads it."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def close(self) -> None:
        """Drain began: Watch streams send their last status and end."""
        self._closed = True
        self.notify()

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: Context
    ) -> health_pb2.HealthCheckResponse:
        status = self.status(request.service)
        if status == _SERVICE_UNKNOWN:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: Context) -> None:
        last = None
        while True:
            changed = self._changed
            status = self.status(request.service)
            if status != last:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                last = status
            if self._closed:
                return
            await changed.wait()
