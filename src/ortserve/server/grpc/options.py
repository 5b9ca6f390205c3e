"""The gRPC listener's transport knobs, from the server settings."""

from __future__ import annotations

from dataclasses import dataclass

from ortserve.settings import ServerSettings

__all__ = ["GrpcOptions"]


@dataclass(frozen=True, slots=True)
class GrpcOptions:
    """Transport knobs of the gRPC listener (see :class:`~ortserve.settings.ServerSettings`)."""

    max_message_bytes: int
    keepalive_time_s: float
    keepalive_timeout_s: float
    max_concurrent_streams: int
    max_header_list_bytes: int = 64 * 1024

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> GrpcOptions:
        message = settings.grpc_max_message_bytes
        return cls(
            max_message_bytes=settings.max_body_bytes if message is None else message,
            keepalive_time_s=settings.grpc_keepalive_time_s,
            keepalive_timeout_s=settings.grpc_keepalive_timeout_s,
            max_concurrent_streams=settings.grpc_max_concurrent_streams,
        )
