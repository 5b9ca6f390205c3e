"""Per-version outcomes of routed requests: totals, last use, and the rollout's window.

Recorded from each answer's done callback on the event loop (one call, a few additions); the
window keeps at most ``LATENCY_SAMPLES`` latencies, the p99 is computed only when a rollout or
the routing ``GET`` asks.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ortserve.errors import OrtServeError
from ortserve.routing.rollout import WindowStats

__all__ = ["LATENCY_SAMPLES", "VersionOutcomes", "is_server_error"]

LATENCY_SAMPLES = 4096


def is_server_error(error: BaseException) -> bool:
    """Failures that count against a version: 5xx (its runner failed, it timed out, it was not
    ready), not the client's mistakes and not 429 (load is not the version's fault)."""
    return not isinstance(error, OrtServeError) or error.http_status >= 500


@dataclass(slots=True)
class VersionOutcomes:
    """Counts since the router was built, and since the current window began."""

    requests: int = 0
    errors: int = 0
    last_request: float | None = None
    window_requests: int = 0
    window_errors: int = 0
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_SAMPLES))
    by_reason: dict[str, int] = field(default_factory=dict)
    """Requests by why the version was chosen (explicit, override, sticky, random, ...)."""

    def arrived(self, now: float, reason: str) -> None:
        """One request routed here (per request: a few additions, no key built)."""
        self.requests += 1
        self.window_requests += 1
        self.last_request = now
        by_reason = self.by_reason
        by_reason[reason] = by_reason.get(reason, 0) + 1

    def settled(self, latency_s: float, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            return
        error = future.exception()
        if error is not None and is_server_error(error):
            self.errors += 1
            self.window_errors += 1
        elif error is None:
            self.latencies.append(latency_s)

    def reset_window(self) -> None:
        self.window_requests = 0
        self.window_errors = 0
        self.latencies.clear()

    def window(self) -> WindowStats:
        p99 = (
            float(np.percentile(np.fromiter(self.latencies, float), 99, method="higher"))
            if self.latencies
            else None
        )
        return WindowStats(self.window_requests, self.window_errors, p99)
