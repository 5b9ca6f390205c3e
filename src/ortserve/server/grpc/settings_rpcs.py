"""Triton's trace and logging extensions over gRPC: ``TraceSetting`` and ``LogSettings``.

The same settings as HTTP's ``/v2/trace/setting`` and ``/v2/logging`` (trace_settings.py,
log_settings.py), in the messages of Triton's grpc_service.proto: trace values are lists of
strings (an empty list clears a model's setting), log values are bool, uint32 or string.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ortserve.errors import InvalidInput, ModelNotFound, NotImplementedByServer
from ortserve.log_settings import LogControl
from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.server.grpc.call import GrpcCall
from ortserve.server.grpc.rpc import Rpc
from ortserve.server.restriction import Restriction
from ortserve.trace_settings import TraceControl

__all__ = ["SettingsExtensions", "settings_rpcs"]


@dataclass(slots=True)
class SettingsExtensions:
    """What the settings calls act on, set on the service by the server."""

    trace: TraceControl
    log: LogControl
    model_exists: Callable[[str], bool]
    restrictions: dict[str, Restriction] = field(default_factory=dict)
    """By API group (``trace``, ``logging``): the metadata a call must carry."""


def settings_rpcs(extensions: Callable[[], SettingsExtensions | None]) -> dict[str, Rpc]:
    """The two methods by name; ``extensions`` is read at each call (None: UNIMPLEMENTED)."""

    def trace_setting(request: pb.TraceSettingRequest, call: GrpcCall) -> pb.TraceSettingResponse:
        found = _extensions(extensions, "trace", call)
        model = request.model_name or None
        if model is not None and not found.model_exists(model):
            raise ModelNotFound(f"unknown model {model!r}")
        if request.settings:
            changes = {key: _trace_value(list(value.value)) for key, value in request.settings.items()}
            view = found.trace.update(changes, model)
        else:
            view = found.trace.view(model)
        response = pb.TraceSettingResponse()
        for key, value in view.items():
            values = value if isinstance(value, list) else [value]
            response.settings[key].value.extend(str(v) for v in values)
        return response

    def log_settings(request: pb.LogSettingsRequest, call: GrpcCall) -> pb.LogSettingsResponse:
        found = _extensions(extensions, "logging", call)
        if request.settings:
            view = found.log.update({key: _log_value(value) for key, value in request.settings.items()})
        else:
            view = found.log.view()
        response = pb.LogSettingsResponse()
        for key, value in view.items():
            entry = response.settings[key]
            if isinstance(value, bool):
                entry.bool_param = value
            elif isinstance(value, int):
                entry.uint32_param = value
            else:
                entry.string_param = str(value)
        return response

    return {
        "TraceSetting": Rpc(pb.TraceSettingRequest, unary=trace_setting),
        "LogSettings": Rpc(pb.LogSettingsRequest, unary=log_settings),
    }


def _extensions(
    extensions: Callable[[], SettingsExtensions | None], group: str, call: GrpcCall
) -> SettingsExtensions:
    found = extensions()
    if found is None:
        raise NotImplementedByServer("trace and log settings are not offered by this server")
    restriction = found.restrictions.get(group)
    if restriction is not None:
        restriction.check(call.metadata_value(restriction.key))
    return found


def _trace_value(values: list[str]) -> Any:
    """A trace setting's values: none clears it, the level is a list, the rest one string."""
    if not values:
        return None
    return values if len(values) > 1 else values[0]


def _log_value(value: pb.LogSettingsRequest.SettingValue) -> Any:
    choice = value.WhichOneof("parameter_choice")
    if choice is None:
        raise InvalidInput("a log setting needs a value (bool_param, uint32_param or string_param)")
    return getattr(value, choice)
