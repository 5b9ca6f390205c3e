"""From the ``serve`` command's flags to the one :class:`~ortserve.settings.ServerSettings`.

A flag's value lands in the settings field of its name; the only exceptions are written here
once: the flags whose field carries a unit suffix or a plural (:data:`RENAMED`) and the flags
that steer the command itself rather than the server (:data:`COMMAND_ONLY`). Adding a server
setting is then a field in ``settings.py`` and a flag in ``serve_options.py``, nothing in
``serve()``: it receives the settings object. ``tests/cli/test_flag_settings.py`` checks that
every flag lands somewhere and every field without a default has a flag.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ortserve.settings import ServerSettings

__all__ = ["COMMAND_ONLY", "RENAMED", "settings_from_flags"]

COMMAND_ONLY = frozenset({"model_name", "workers", "demo", "ort_telemetry"})
"""Flags the command acts on before the server exists (a single-model view, worker processes,
writing the demo models, ONNX Runtime's telemetry before its import)."""

RENAMED: Mapping[str, str] = {
    "header_timeout": "header_timeout_s",
    "keepalive_timeout": "keepalive_timeout_s",
    "request_timeout": "request_timeout_s",
    "grpc_keepalive_time": "grpc_keepalive_time_s",
    "grpc_keepalive_timeout": "grpc_keepalive_timeout_s",
    "shutdown_grace": "shutdown_grace_s",
    "shutdown_delay": "shutdown_delay_s",
    "api_key": "api_keys",
}
"""Flag (as click names its parameter) -> settings field, where the two differ."""

_FIELDS = frozenset(field.name for field in dataclasses.fields(ServerSettings))


def settings_from_flags(flags: Mapping[str, object]) -> ServerSettings:
    """The settings the flags describe (command-only flags left out).

    Raises:
        TypeError: a flag names no settings field (a new flag needs its field, or a place in
            :data:`RENAMED` or :data:`COMMAND_ONLY`).
    """
    values: dict[str, object] = {}
    for flag, value in flags.items():
        if flag in COMMAND_ONLY:
            continue
        field = RENAMED.get(flag, flag)
        if field not in _FIELDS:
            raise TypeError(f"--{flag.replace('_', '-')} names no ServerSettings field")
        values[field] = value
    return ServerSettings(**values)  # type: ignore[arg-type]
