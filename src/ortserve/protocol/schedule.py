"""Triton's schedule-policy request parameters (``priority``, ``timeout``), read the same on every transport."""

from __future__ import annotations

from ortserve.core.types import Parameters
from ortserve.errors import InvalidInput

__all__ = ["schedule_fields"]


def schedule_fields(parameters: Parameters) -> tuple[int, float | None]:
    """The request's priority lane (0: the model's default) and timeout in seconds (None: none).

    Raises:
        InvalidInput: ``priority`` or ``timeout`` (microseconds) is not a non-negative integer.
    """
    priority = parameters.get("priority", 0)
    if type(priority) is not int or priority < 0:
        raise InvalidInput("parameter 'priority' must be a non-negative integer")
    timeout = parameters.get("timeout", 0)
    if type(timeout) is not int or timeout < 0:
        raise InvalidInput("parameter 'timeout' must be a non-negative integer (microseconds)")
    return priority, (timeout / 1e6 if timeout else None)
