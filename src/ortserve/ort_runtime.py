"""ONNX Runtime's own process-wide behaviour: where its log lines go, and its telemetry.

ONNX Runtime logs from C++; by default straight to stderr, in ANSI-coloured text lines (a
failing run writes ``[E:onnxruntime:, sequential_executor.cc...]``), past Python's logging, so
``--log-format json`` would not be pure JSON. ONNX Runtime 1.32 takes a Python callback for its
default logger (``set_default_logger_callback``): every message it emits on a Python thread
(session builds, runs, the ones ortserve's own threads make) becomes a record of the
``onnxruntime`` logger here, with its severity mapped (verbose/info -> DEBUG/INFO, warning ->
WARNING, error -> ERROR, fatal -> CRITICAL) and its category, log id and code location as
fields, so it is formatted, filtered and shipped as every other record.

What stays outside: ONNX Runtime sends a message from a thread Python does not know (its own
intra-op pool) to its platform sink, since taking the GIL there can deadlock. Kernels seldom log
from those threads; the threshold applies to them too, so at the default level only their
warnings and errors could still reach stderr as text.

The threshold follows ortserve's level (warnings at INFO, ONNX Runtime's info at DEBUG). Each
session takes it when built (core/session.py), which is also where the callback is installed
when ONNX Runtime was imported after logging was configured: the supervisor of ``--workers N``
configures logging, then forks a zygote that must import ONNX Runtime itself.

ONNX Runtime 1.32 creates a telemetry store with a device id under ``$HOME/.cache`` when it is
imported; ``ORT_DISABLE_TELEMETRY=1`` set before the import prevents it, and
``disable_telemetry_events()`` stops the events. Both are the default here; ``--ort-telemetry``
leaves them as ONNX Runtime has them.
"""

from __future__ import annotations

import logging
import os
import sys
import types

__all__ = [
    "ORT_LOG_FIELDS",
    "ORT_TELEMETRY_VARIABLE",
    "ort_log_severity",
    "prepare_onnxruntime",
    "route_onnxruntime_logs",
    "session_log_severity",
]

ORT_TELEMETRY_VARIABLE = "ORT_DISABLE_TELEMETRY"
ORT_LOG_FIELDS = ("ort_category", "ort_logid", "code_location")
"""The ``extra`` keys of a record forwarded from ONNX Runtime's logger (JSON keys of their own)."""
_VERBOSE, _INFO, _WARNING, _ERROR, _FATAL = range(5)
_LEVELS = (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)
_wanted: list[int] = []
"""The severity logging was configured with (empty: never; ONNX Runtime's own default)."""
_routed: list[int] = []
"""The severity the callback is installed with in this process (empty: not installed)."""
_ORT_LOGGER = logging.getLogger("onnxruntime")


def prepare_onnxruntime(allow_telemetry: bool) -> None:
    """Before ONNX Runtime is imported (children inherit the variable): telemetry off unless allowed."""
    if allow_telemetry:
        return
    os.environ[ORT_TELEMETRY_VARIABLE] = "1"
    module = sys.modules.get("onnxruntime")
    if module is not None:  # imported already: at least no events from now on
        module.disable_telemetry_events()


def ort_log_severity(level: str) -> int:
    """ONNX Runtime's logger threshold (0 verbose .. 4 fatal) for ortserve's log level: its
    warnings from INFO on, its info messages at DEBUG (its verbose messages never: they are a
    trace of every node)."""
    return {"DEBUG": _INFO, "INFO": _WARNING, "WARNING": _WARNING, "ERROR": _ERROR}.get(level.upper(), _FATAL)


def route_onnxruntime_logs(level: str) -> None:
    """Send ONNX Runtime's log messages through Python's logging at ``level``'s threshold: now
    if ONNX Runtime is imported (never imports it), else when the first session is built."""
    _wanted[:] = [ort_log_severity(level)]
    module = sys.modules.get("onnxruntime")
    if type(module) is types.ModuleType:  # the real module, not the zygote's placeholder
        _install(module)


def session_log_severity() -> int:
    """A session's ``log_severity_level``: the configured one, else -1 (ONNX Runtime's default).
    Called as each session is built, it also installs the log callback if it is not yet."""
    if not _wanted:
        return -1
    module = sys.modules.get("onnxruntime")
    if type(module) is types.ModuleType and _routed != _wanted:
        _install(module)
    return _wanted[0]


def _install(module: types.ModuleType) -> None:
    module.set_default_logger_callback(_forward, _wanted[0])
    _routed[:] = _wanted
    if os.environ.get(ORT_TELEMETRY_VARIABLE) == "1":
        module.disable_telemetry_events()


def _forward(severity: int, category: str, logid: str, code_location: str, message: str) -> None:
    """ONNX Runtime's callback: one record of the ``onnxruntime`` logger. It runs on the thread
    that logged, holding the GIL, so it only hands the record to logging's handlers."""
    level = _LEVELS[severity] if 0 <= severity < len(_LEVELS) else logging.ERROR
    if _ORT_LOGGER.isEnabledFor(level):
        extra = {"ort_category": category, "ort_logid": logid or None, "code_location": code_location}
        _ORT_LOGGER.log(level, "%s", message.rstrip("\n"), extra=extra)
