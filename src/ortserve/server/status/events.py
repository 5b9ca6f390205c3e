"""Recent warnings and errors of the server's log, for the status page: a bounded ring.

Load failures, breakers opening, rollouts rolled back and refused configurations are logged
once each (never per request), so the last few are what an operator wants to see first.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

__all__ = ["EventLog", "install_event_log"]

_KEPT = 50
_MESSAGE_CHARS = 500


class EventLog(logging.Handler):
    """Keeps the last ``kept`` records at WARNING and above."""

    def __init__(self, kept: int = _KEPT) -> None:
        super().__init__(logging.WARNING)
        self._records: deque[dict[str, Any]] = deque(maxlen=kept)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a bad format string in someone's log call
            message = str(record.msg)
        self._records.append(
            {
                "time": record.created,
                "level": record.levelname,
                "logger": record.name,
                "message": message[:_MESSAGE_CHARS],
            }
        )

    def recent(self) -> list[dict[str, Any]]:
        """Newest first."""
        return list(self._records)[::-1]

    def note(self, level: str, message: str) -> None:
        """Record an event that is not a log line."""
        self._records.append({"time": time.time(), "level": level, "logger": "", "message": message})


_INSTALLED: EventLog | None = None


def install_event_log() -> EventLog:
    """The process's event log, attached to the ``ortserve`` logger once."""
    global _INSTALLED
    if _INSTALLED is None:
        _INSTALLED = EventLog()
        logging.getLogger("ortserve").addHandler(_INSTALLED)
    return _INSTALLED
