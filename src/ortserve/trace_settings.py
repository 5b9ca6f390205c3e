"""Triton's trace extension settings (``/v2/trace/setting``, gRPC ``TraceSetting``), for the
settings ortserve has: ``trace_level`` (OFF or TIMESTAMPS: spans carry phase timestamps, never
tensors), ``trace_rate`` (one request in N is traced), ``trace_count`` (traces left, -1 for no
limit), ``trace_file`` (where spans go: the ``--trace-exporter``, reported, not settable over
the API: a client must not choose where the server writes) and ``log_frequency`` (0: spans are
exported by OpenTelemetry's batch processor as they end).

Global settings, and per-model ones that override them (a setting given ``null`` falls back to
the global one, as Triton). Tracing itself exists only when the server started with it
(``--trace-sampling-ratio`` above 0 and ``ortserve[otel]``); otherwise the level is OFF and
turning it on is refused with that reason. Each process of ``--workers N`` keeps its own.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any

from ortserve.errors import InvalidInput

__all__ = ["TRACE_KEYS", "TraceControl", "rate_of_ratio"]

TRACE_KEYS = ("trace_file", "trace_level", "trace_rate", "trace_count", "log_frequency")
_LEVELS = ("OFF", "TIMESTAMPS")
_MAX_RATE = 1 << 31
_MAX_MODELS = 4096
"""Models with settings of their own at most (each is a dict entry)."""


def rate_of_ratio(ratio: float) -> int:
    """``--trace-sampling-ratio`` as a Triton ``trace_rate``: one request in N."""
    if ratio <= 0 or ratio >= 1:
        return 1
    return max(1, min(_MAX_RATE, round(1 / ratio)))


@dataclass(frozen=True, slots=True)
class _Scope:
    level: str | None = None
    rate: int | None = None
    count: int | None = None


class TraceControl:
    """The trace settings in force, and the per-request decision they make.

    Args:
        available: tracing was built at start (spans have somewhere to go).
        rate: the start-up ``trace_rate`` (from ``--trace-sampling-ratio``).
        destination: the exporter spans go to (``otlp``, ``console``), reported as ``trace_file``.
    """

    def __init__(self, available: bool, rate: int = 1, destination: str = "") -> None:
        self.available = available
        self._default = _Scope("TIMESTAMPS" if available else "OFF", rate, -1)
        self._global = self._default
        self._models: dict[str, _Scope] = {}
        self._seen: dict[str | None, int] = {}
        self._destination = destination if available else ""
        self._lock = threading.Lock()  # gRPC and HTTP share it; admit runs on the loop

    def admit(self, model: str, caller_sampled: bool = False) -> bool:
        """Whether this request of ``model`` is traced (counts it against rate and count).

        A caller's sampled ``traceparent`` skips the rate (the caller chose), not the level
        or the count.
        """
        with self._lock:
            own = self._models.get(model)
            level = own.level if own is not None and own.level is not None else self._global.level
            if level == "OFF":
                return False
            rate_key = model if own is not None and own.rate is not None else None
            rate = own.rate if own is not None and own.rate is not None else self._global.rate
            if not caller_sampled:
                seen = self._seen.get(rate_key, 0)
                self._seen[rate_key] = seen + 1
                if seen % (rate or 1):
                    return False
            counted_by_model = own is not None and own.count is not None
            count = own.count if counted_by_model and own is not None else self._global.count
            if count == 0:
                return False
            if count is not None and count > 0:
                if counted_by_model and own is not None:
                    self._models[model] = replace(own, count=count - 1)
                else:
                    self._global = replace(self._global, count=count - 1)
            return True

    def view(self, model: str | None = None) -> dict[str, Any]:
        """The settings in force for ``model`` (or the global ones), as Triton's JSON gives them."""
        with self._lock:
            own = self._models.get(model) if model is not None else None
            scope = self._global if own is None else _merged(own, self._global)
            return {
                "trace_file": self._destination,
                "trace_level": [scope.level],
                "trace_rate": str(scope.rate),
                "trace_count": str(scope.count),
                "log_frequency": "0",
            }

    def update(self, changes: dict[str, Any], model: str | None = None) -> dict[str, Any]:
        """Apply ``changes`` (all or none; ``None`` clears a setting) and return the new view.

        Values are as Triton's JSON has them: strings, or a list of strings for the level;
        numbers are taken too.

        Raises:
            InvalidInput: an unknown setting, a value out of range, TENSORS, a ``trace_file``
                or ``log_frequency`` other than the one in force, or tracing turned on in a
                server started without it.
        """
        parsed: dict[str, Any] = {}
        for key, value in changes.items():
            if key not in TRACE_KEYS:
                raise InvalidInput(f"unknown trace setting {key!r}; the settings are {', '.join(TRACE_KEYS)}")
            parsed[key] = None if value is None else _parse(key, value, self._destination)
        if parsed.get("trace_level") == "TIMESTAMPS" and not self.available:
            raise InvalidInput(
                "tracing is not available in this server: start it with --trace-sampling-ratio above 0 "
                "and OpenTelemetry installed (pip install 'ortserve[otel]')"
            )
        with self._lock:
            if model is not None and model not in self._models and len(self._models) >= _MAX_MODELS:
                raise InvalidInput(f"at most {_MAX_MODELS} models may have trace settings of their own")
            base = self._models.get(model, _Scope()) if model is not None else self._global
            fallback = _Scope() if model is not None else self._default
            scope = _Scope(
                _pick(parsed, "trace_level", base.level, fallback.level),
                _pick(parsed, "trace_rate", base.rate, fallback.rate),
                _pick(parsed, "trace_count", base.count, fallback.count),
            )
            if model is None:
                self._global = scope
            else:
                self._models[model] = scope
            if "trace_rate" in parsed:
                self._seen.pop(model, None)
        return self.view(model)


def _pick(parsed: dict[str, Any], key: str, current: Any, cleared: Any) -> Any:
    if key not in parsed:
        return current
    return cleared if parsed[key] is None else parsed[key]


def _merged(own: _Scope, base: _Scope) -> _Scope:
    return _Scope(
        own.level if own.level is not None else base.level,
        own.rate if own.rate is not None else base.rate,
        own.count if own.count is not None else base.count,
    )


def _parse(key: str, value: Any, destination: str) -> Any:
    if key == "trace_level":
        levels = value if isinstance(value, list) else [value]
        if not levels or not all(isinstance(level, str) for level in levels):
            raise InvalidInput("trace_level must be a list of OFF or TIMESTAMPS")
        wanted = {level.upper() for level in levels}
        if "TENSORS" in wanted:
            raise InvalidInput("trace_level TENSORS is not supported: ortserve's spans carry timestamps only")
        if not wanted <= set(_LEVELS) or len(wanted) != 1:
            raise InvalidInput("trace_level must be OFF or TIMESTAMPS")
        return wanted.pop()
    if key == "trace_file":
        if value != destination:
            raise InvalidInput(
                f"trace_file cannot be set over the API: spans go to the --trace-exporter "
                f"({destination or 'none'}), chosen when the server starts"
            )
        return None
    number = _integer(key, value)
    if key == "trace_rate":
        if not 1 <= number <= _MAX_RATE:
            raise InvalidInput(f"trace_rate must be an integer in 1..{_MAX_RATE}")
        return number
    if key == "trace_count":
        if not -1 <= number <= _MAX_RATE:
            raise InvalidInput(f"trace_count must be -1 (no limit) or an integer in 0..{_MAX_RATE}")
        return number
    if number != 0:  # log_frequency
        raise InvalidInput("log_frequency must be 0: spans are exported as they end, not every N traces")
    return None


def _integer(key: str, value: Any) -> int:
    if isinstance(value, bool):
        raise InvalidInput(f"{key} must be an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and len(value) <= 12:
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise InvalidInput(f"{key} must be an integer")
