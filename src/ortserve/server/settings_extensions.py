"""Triton's trace and logging settings extensions, wired onto a server's two transports."""

from __future__ import annotations

from ortserve.log_settings import LogControl
from ortserve.repository.registry import ModelRegistry
from ortserve.server.grpc.service import InferenceService
from ortserve.server.grpc.settings_rpcs import SettingsExtensions
from ortserve.server.http.app import HttpApp
from ortserve.server.http.settings_routes import add_settings_routes
from ortserve.server.restriction import parse_restriction
from ortserve.settings import ServerSettings
from ortserve.trace_settings import TraceControl

__all__ = ["SETTINGS_EXTENSIONS", "add_settings_extensions"]

SETTINGS_EXTENSIONS = ("trace", "logging")
"""Their names among the server metadata's extensions."""


def add_settings_extensions(
    app: HttpApp,
    service: InferenceService | None,
    trace: TraceControl,
    settings: ServerSettings,
    registry: ModelRegistry,
) -> SettingsExtensions:
    """Serve the settings on HTTP (``/v2/trace/setting``, ``/v2/logging``) and gRPC (when on),
    restricted as ``--http-restricted-api`` / ``--grpc-restricted-protocol`` say for the
    ``trace`` and ``logging`` groups."""

    def model_exists(name: str) -> bool:
        return registry.find(name) is not None

    log = LogControl(settings.log_format, settings.log_level)
    http = parse_restriction(settings.http_restricted_api) if settings.http_restricted_api else {}
    add_settings_routes(app, trace, log, model_exists, http)
    grpc = parse_restriction(settings.grpc_restricted_protocol) if settings.grpc_restricted_protocol else {}
    extensions = SettingsExtensions(trace, log, model_exists, grpc)
    if service is not None:
        service.settings_extensions = extensions
    return extensions
