"""ONNX Runtime's own process-wide behaviour: its logger's severity and its telemetry.

ONNX Runtime logs from C++ straight to stderr, in ANSI-coloured text lines (a failing run
writes ``[E:onnxruntime:, sequential_executor.cc...]``), past Python's logging; every such
error also comes back as the exception ortserve logs in its own format. So its loggers are
quietened: under ``--log-format json`` to FATAL only (nothing unstructured reaches the log
stream), in text to errors (warnings too at DEBUG). Each session takes the severity when it is
built (core/session.py); the default logger too when ONNX Runtime is already imported. Logging
is configured before that import on purpose: the zygote of ``--workers N`` must not inherit it.

ONNX Runtime 1.32 creates a telemetry store with a device id under ``$HOME/.cache`` when it is
imported; ``ORT_DISABLE_TELEMETRY=1`` set before the import prevents it, and
``disable_telemetry_events()`` stops the events. Both are the default here; ``--ort-telemetry``
leaves them as ONNX Runtime has them.
"""

from __future__ import annotations

import os
import sys
import types

__all__ = [
    "ORT_TELEMETRY_VARIABLE",
    "ort_log_severity",
    "prepare_onnxruntime",
    "quiet_onnxruntime",
    "session_log_severity",
]

ORT_TELEMETRY_VARIABLE = "ORT_DISABLE_TELEMETRY"
_VERBOSE, _INFO, _WARNING, _ERROR, _FATAL = range(5)
_wanted: list[int] = []
"""The severity logging was configured with (empty: never; ONNX Runtime's own default)."""


def prepare_onnxruntime(allow_telemetry: bool) -> None:
    """Before ONNX Runtime is imported (children inherit the variable): telemetry off unless allowed."""
    if allow_telemetry:
        return
    os.environ[ORT_TELEMETRY_VARIABLE] = "1"
    module = sys.modules.get("onnxruntime")
    if module is not None:  # imported already: at least no events from now on
        module.disable_telemetry_events()


def ort_log_severity(level: str, fmt: str) -> int:
    """ONNX Runtime's logger severity (0 verbose .. 4 fatal) for ortserve's level and format."""
    if fmt == "json":
        return _FATAL
    return {"DEBUG": _WARNING, "INFO": _ERROR, "WARNING": _ERROR}.get(level.upper(), _FATAL)


def quiet_onnxruntime(level: str, fmt: str) -> None:
    """Quieten ONNX Runtime for ``level`` and ``fmt``: the sessions built from now on, and the
    default logger if ONNX Runtime is imported already (never imports it)."""
    _wanted[:] = [ort_log_severity(level, fmt)]
    module = sys.modules.get("onnxruntime")
    if type(module) is types.ModuleType:  # the real module, not the zygote's placeholder
        module.set_default_logger_severity(_wanted[0])
        if os.environ.get(ORT_TELEMETRY_VARIABLE) == "1":
            module.disable_telemetry_events()


def session_log_severity() -> int:
    """A session's ``log_severity_level``: the configured one, else -1 (ONNX Runtime's default)."""
    return _wanted[0] if _wanted else -1
