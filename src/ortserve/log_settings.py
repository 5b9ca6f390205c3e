"""Triton's logging extension settings (``/v2/logging``, gRPC ``LogSettings``), for the settings
ortserve has: ``log_info``, ``log_warning``, ``log_error`` (each severity on or off),
``log_verbose_level`` (above 0: DEBUG records too), ``log_format`` (``text`` or ``json``;
Triton's ``default`` and ``ISO8601`` are text, whose time is ISO 8601 already) and ``log_file``
(reported: the log goes to stderr, and a client must not choose where the server writes).

The settings act on the root logger's handlers (those ``configure_logging`` installed), so they
hold for ONNX Runtime's records too once routed through it. Each process of ``--workers N``
keeps its own.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ortserve.errors import InvalidInput
from ortserve.logs import make_formatter
from ortserve.ort_runtime import route_onnxruntime_logs

__all__ = ["LOG_KEYS", "LogControl"]

LOG_KEYS = ("log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format")
_FORMATS = {"text": "text", "json": "json", "default": "text", "iso8601": "text"}
_MAX_VERBOSE = 1 << 16


class _Severities(logging.Filter):
    """Drops the records of the severities switched off (installed on every root handler)."""

    def __init__(self, control: LogControl) -> None:
        super().__init__()
        self._control = control

    def filter(self, record: logging.LogRecord) -> bool:
        control = self._control
        if record.levelno >= logging.ERROR:
            return control.error
        if record.levelno >= logging.WARNING:
            return control.warning
        if record.levelno >= logging.INFO:
            return control.info
        return control.verbose > 0


class LogControl:
    """The log settings in force; :meth:`install` hooks them onto the root logger's handlers.

    Args:
        fmt: the start-up ``--log-format`` (``text`` or ``json``).
        level: the start-up ``--log-level``.
        logger: the logger whose level and handlers the settings act on (default: the root).
            Nothing changes until the first update.
    """

    def __init__(self, fmt: str = "text", level: str = "INFO", logger: logging.Logger | None = None) -> None:
        number = logging.getLevelName(level.upper())
        number = number if isinstance(number, int) else logging.INFO
        self.format = fmt
        self.verbose = 1 if number < logging.INFO else 0
        self.info = number <= logging.INFO
        self.warning = number <= logging.WARNING
        self.error = number <= logging.ERROR
        self._filter = _Severities(self)
        self._lock = threading.Lock()
        self._logger = logger or logging.getLogger()

    def install(self) -> None:
        """Apply the settings to the logger and its handlers (idempotent)."""
        root = self._logger
        for handler in root.handlers:
            if self._filter not in handler.filters:
                handler.addFilter(self._filter)
        self._apply(root)

    def view(self) -> dict[str, Any]:
        """The settings, as Triton's JSON gives them."""
        return {
            "log_file": "",
            "log_info": self.info,
            "log_warning": self.warning,
            "log_error": self.error,
            "log_verbose_level": self.verbose,
            "log_format": self.format,
        }

    def update(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply ``changes`` (all or none) and return the new view.

        Raises:
            InvalidInput: an unknown setting, a value of the wrong type or out of range, an
                unknown format, or a ``log_file`` (the log goes to stderr).
        """
        parsed: dict[str, Any] = {}
        for key, value in changes.items():
            if key not in LOG_KEYS:
                raise InvalidInput(f"unknown log setting {key!r}; the settings are {', '.join(LOG_KEYS)}")
            parsed[key] = _parse(key, value)
        with self._lock:
            for key in ("info", "warning", "error"):
                if f"log_{key}" in parsed:
                    setattr(self, key, parsed[f"log_{key}"])
            if "log_verbose_level" in parsed:
                self.verbose = parsed["log_verbose_level"]
            if "log_format" in parsed:
                self.format = parsed["log_format"]
            self.install()
            if "log_format" in parsed or "log_verbose_level" in parsed:
                route_onnxruntime_logs("DEBUG" if self.verbose else "INFO")
        return self.view()

    def _apply(self, root: logging.Logger) -> None:
        lowest = [
            level
            for level, on in (
                (logging.DEBUG, self.verbose > 0),
                (logging.INFO, self.info),
                (logging.WARNING, self.warning),
                (logging.ERROR, self.error),
            )
            if on
        ]
        root.setLevel(lowest[0] if lowest else logging.CRITICAL + 1)
        formatter = make_formatter(self.format)
        for handler in root.handlers:
            if self._filter in handler.filters:
                handler.setFormatter(formatter)


def _parse(key: str, value: Any) -> Any:
    if key in ("log_info", "log_warning", "log_error"):
        if not isinstance(value, bool):
            raise InvalidInput(f"{key} must be true or false")
        return value
    if key == "log_verbose_level":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_VERBOSE:
            raise InvalidInput(f"log_verbose_level must be an integer in 0..{_MAX_VERBOSE}")
        return value
    if key == "log_format":
        chosen = _FORMATS.get(value.lower()) if isinstance(value, str) else None
        if chosen is None:
            raise InvalidInput("log_format must be text or json (Triton's default and ISO8601 are text)")
        return chosen
    if value != "":  # log_file
        raise InvalidInput("log_file cannot be set over the API: the log goes to stderr")
    return None
