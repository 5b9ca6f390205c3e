"""Triton's schedule-policy request parameters (``priority``, ``timeout``), read the same on every
transport; its sequence parameters are refused (every model served here is stateless)."""

from __future__ import annotations

from ortserve.core.types import Parameters
from ortserve.errors import InvalidInput

__all__ = ["schedule_fields"]


def schedule_fields(parameters: Parameters) -> tuple[int, float | None]:
    """The request's priority lane (0: the model's default) and timeout in seconds (None: none).

    Raises:
        InvalidInput: ``priority`` or ``timeout`` (microseconds) is not a non-negative integer,
            or the request names a sequence (``sequence_id``, ``sequence_start``, ``sequence_end``).
    """
    priority = parameters.get("priority", 0)
    if type(priority) is not int or priority < 0:
        raise InvalidInput("parameter 'priority' must be a non-negative integer")
    timeout = parameters.get("timeout", 0)
    if type(timeout) is not int or timeout < 0:
        raise InvalidInput("parameter 'timeout' must be a non-negative integer (microseconds)")
    if any(parameters.get(name) for name in _SEQUENCE):
        # Served as one more stateless request, a sequence would lose its state silently.
        raise InvalidInput(
            "parameter 'sequence_id': the model is stateless (ortserve serves no sequence-batching "
            "models); send each request without sequence_id, sequence_start and sequence_end"
        )
    return priority, (timeout / 1e6 if timeout else None)


_SEQUENCE = ("sequence_id", "sequence_start", "sequence_end")
"""Triton's sequence parameters (0, "" and false mean none, as tritonclient sends by default)."""
