"""ONNX Runtime's own process-wide behaviour: its logger's severity and its telemetry.

ONNX Runtime logs from C++ straight to stderr, in ANSI-coloured text lines (a failing run
writes ``[E:onnxruntime:, sequential_executor.cc...]``), past Python's logging; every such
error also comes back as the exception ortserve logs in its own format. So its default logger
is quietened: under ``--log-format json`` to FATAL only (nothing unstructured reaches the log
stream), in text to errors (warnings too at DEBUG).

ONNX Runtime 1.32 creates a telemetry store with a device id under ``$HOME/.cache`` when it is
imported; ``ORT_DISABLE_TELEMETRY=1`` set before the import prevents it, and
``disable_telemetry_events()`` stops the events. Both are the default here; ``--ort-telemetry``
leaves them as ONNX Runtime has them.
"""

from __future__ import annotations

import os
import sys

__all__ = ["ORT_TELEMETRY_VARIABLE", "ort_log_severity", "prepare_onnxruntime", "quiet_onnxruntime"]

ORT_TELEMETRY_VARIABLE = "ORT_DISABLE_TELEMETRY"
_VERBOSE, _INFO, _WARNING, _ERROR, _FATAL = range(5)


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
    """Set ONNX Runtime's default logger severity (sessions inherit it) for ``level`` and ``fmt``."""
    import onnxruntime

    onnxruntime.set_default_logger_severity(ort_log_severity(level, fmt))
    if os.environ.get(ORT_TELEMETRY_VARIABLE) == "1":
        onnxruntime.disable_telemetry_events()
