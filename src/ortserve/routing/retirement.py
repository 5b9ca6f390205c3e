"""Automatic retirement: which versions have been idle, or failing, long enough to retire.

Pure: the caller passes the time, the versions and their outcomes, and keeps the error
windows (:class:`ErrorWindow`) between calls. A version is never retired when it is the last
one able to take default traffic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ortserve.config.routing import RetireConfig
from ortserve.routing.outcomes import VersionOutcomes

__all__ = ["ErrorWindow", "due_for_retirement"]


@dataclass(slots=True)
class ErrorWindow:
    """A tumbling window of one version's totals: where they stood when it began."""

    start: float
    requests: int
    errors: int


def due_for_retirement(
    config: RetireConfig,
    now: float,
    serving: Sequence[str],
    first_seen: Mapping[str, float],
    outcomes: Mapping[str, VersionOutcomes],
    windows: dict[str, ErrorWindow],
) -> list[tuple[str, str]]:
    """(version, reason) for each version to retire now, newest last.

    Args:
        serving: versions able to take default traffic, newest first (shadow-only, rejected
            and deprecated ones left out); the last of them left is never retired.
        first_seen: when each version was first seen serving (idle time counts from there
            when it has had no request).
        windows: the error windows, updated in place.
    """
    due: list[tuple[str, str]] = []
    for version in serving:
        seen = outcomes.get(version, VersionOutcomes())
        reason = _idle(config, now, seen, first_seen.get(version, now)) or _failing(
            config, now, version, seen, windows
        )
        if reason is not None and len(serving) - len(due) > 1:
            due.append((version, reason))
    return due


def _idle(config: RetireConfig, now: float, seen: VersionOutcomes, since: float) -> str | None:
    if config.idle is None:
        return None
    last = seen.last_request if seen.last_request is not None else since
    if now - last < config.idle:
        return None
    return f"no request for {_human(now - last)} (idle limit {_human(config.idle)})"


def _failing(
    config: RetireConfig, now: float, version: str, seen: VersionOutcomes, windows: dict[str, ErrorWindow]
) -> str | None:
    if config.max_error_rate is None:
        return None
    window = windows.get(version)
    if window is None:
        windows[version] = ErrorWindow(now, seen.requests, seen.errors)
        return None
    if now - window.start < config.window:
        return None
    requests, errors = seen.requests - window.requests, seen.errors - window.errors
    windows[version] = ErrorWindow(now, seen.requests, seen.errors)
    if requests < config.min_requests or errors / requests <= config.max_error_rate:
        return None
    return (
        f"error rate {errors / requests:.4f} > {config.max_error_rate:g} "
        f"({errors} of {requests} requests in {_human(config.window)})"
    )


def _human(seconds: float) -> str:
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g}{unit}"
    return f"{seconds:.3g}s"
