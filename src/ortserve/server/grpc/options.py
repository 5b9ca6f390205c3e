"""The gRPC listener's transport knobs, from the server settings."""

from __future__ import annotations

from dataclasses import dataclass

from ortserve.server.http2.config import EngineConfig
from ortserve.server.http2.frames import MAX_WINDOW
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
    preface_timeout_s: float = 10.0
    """A new connection must send the HTTP/2 preface within this (``--header-timeout``); a
    call's request may take as long plus a second per ``request_min_rate`` bytes."""
    request_min_rate: float = 500.0
    """``--request-min-rate``: see :attr:`~ortserve.settings.ServerSettings.request_min_rate`."""
    request_timeout_s: float = 120.0
    """``--request-timeout``: a call's request must arrive whole within this of its HEADERS."""

    def engine(self) -> EngineConfig:
        """The HTTP/2 engine's limits: a connection window with room for the largest message plus
        a stream window, so a big message never stalls."""
        stream_window = 4 << 20
        return EngineConfig(
            max_concurrent_streams=self.max_concurrent_streams,
            max_header_list_bytes=self.max_header_list_bytes,
            stream_window=stream_window,
            connection_window=min(MAX_WINDOW, max(16 << 20, self.max_message_bytes + stream_window)),
            keepalive_time_s=self.keepalive_time_s,
            keepalive_timeout_s=self.keepalive_timeout_s,
            preface_timeout_s=self.preface_timeout_s,
            request_grace_s=self.preface_timeout_s,
            request_min_rate=self.request_min_rate,
            request_timeout_s=self.request_timeout_s,
        )

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> GrpcOptions:
        message = settings.grpc_max_message_bytes
        return cls(
            max_message_bytes=settings.max_body_bytes if message is None else message,
            keepalive_time_s=settings.grpc_keepalive_time_s,
            keepalive_timeout_s=settings.grpc_keepalive_timeout_s,
            max_concurrent_streams=settings.grpc_max_concurrent_streams,
            preface_timeout_s=settings.header_timeout_s,
            request_min_rate=settings.request_min_rate,
            request_timeout_s=settings.request_timeout_s,
        )
