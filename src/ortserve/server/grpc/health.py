"""grpc.health.v1 answered from the DataPlane's readiness, for load balancers and probes."""

from __future__ import annotations

import asyncio

from grpc_health.v1 import health_pb2

from ortserve.core.dataplane import DataPlane
from ortserve.errors import ModelNotFound
from ortserve.server.grpc.call import GrpcCall
from ortserve.server.grpc.errors import GrpcAbort, StatusCode
from ortserve.server.grpc.rpc import Rpc
from ortserve.server.grpc.service import INFERENCE_SERVICE

__all__ = ["HEALTH_SERVICE", "ReadinessHealth"]

HEALTH_SERVICE = "grpc.health.v1.Health"
_SERVING: int = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING: int = health_pb2.HealthCheckResponse.NOT_SERVING
_SERVICE_UNKNOWN: int = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class ReadinessHealth:
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

    def routes(self) -> dict[str, Rpc]:
        """The two methods of grpc.health.v1.Health, by HTTP/2 path."""
        return {
            f"/{HEALTH_SERVICE}/Check": Rpc(health_pb2.HealthCheckRequest, unary=self.check),
            f"/{HEALTH_SERVICE}/Watch": Rpc(health_pb2.HealthCheckRequest, streaming=self.watch),
        }

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

    def check(self, request: health_pb2.HealthCheckRequest, call: GrpcCall) -> health_pb2.HealthCheckResponse:
        status = self.status(request.service)
        if status == _SERVICE_UNKNOWN:
            raise GrpcAbort(StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def watch(self, call: GrpcCall) -> None:
        request = await call.read()
        if request is None:
            raise GrpcAbort(StatusCode.INVALID_ARGUMENT, "Watch needs a HealthCheckRequest")
        assert isinstance(request, health_pb2.HealthCheckRequest)
        last = None
        while True:
            changed = self._changed
            status = self.status(request.service)
            if status != last:
                call.write(health_pb2.HealthCheckResponse(status=status))
                last = status
            if self._closed:
                return
            await changed.wait()
