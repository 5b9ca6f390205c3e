"""Logging set up once at the CLI edge: text or JSON lines, tagged with the request's context."""

from __future__ import annotations

import json
import logging
import sys
import time
from contextvars import ContextVar

__all__ = ["MODEL", "REQUEST_ID", "VERSION", "configure_logging"]

REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)
"""The request being handled by the current task (OIP ``id`` or ``X-Request-ID``)."""
MODEL: ContextVar[str | None] = ContextVar("model", default=None)
VERSION: ContextVar[str | None] = ContextVar("version", default=None)
_CONTEXT = (("request_id", REQUEST_ID), ("model", MODEL), ("version", VERSION))


class _RequestContext(logging.Filter):
    """Copies the request's context variables onto every record logged while handling it."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, var in _CONTEXT:
            if getattr(record, key, None) is None:
                setattr(record, key, var.get())
        return True


class _TextFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        tags = [f"{key}={value}" for key, _ in _CONTEXT if (value := getattr(record, key, None)) is not None]
        return f"{line} [{' '.join(tags)}]" if tags else line


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("request_id", "model", "version"):
            value = getattr(record, key, None)
            if value is not None:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Send logs to stderr in ``text`` or ``json`` format; replaces earlier handlers."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(_TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_RequestContext())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
