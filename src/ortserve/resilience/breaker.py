"""A circuit breaker for one execution level, on an injected clock."""

from __future__ import annotations

import enum
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ortserve.resilience.classify import FailureKind

__all__ = ["Breaker", "BreakerPolicy", "BreakerState"]

_SLICES = 20
"""The failure-rate window is counted in this many slices."""


class BreakerState(enum.Enum):
    CLOSED = "closed"
    """Traffic runs on the level."""
    OPEN = "open"
    """The level is skipped until its probe is due."""
    HALF_OPEN = "half_open"
    """A probe (the warm-up inputs) is running; traffic still skips the level."""


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """When to open and how long to stay open (see BreakerConfig for the meanings)."""

    consecutive_failures: int = 3
    failure_rate: float = 0.5
    window_s: float = 10.0
    min_runs: int = 20
    open_s: float = 2.0
    max_open_s: float = 60.0


class Breaker:
    """Counts a level's runs and says whether traffic may use it.

    Opens after ``consecutive_failures`` persistent failures in a row, or when failures of any
    kind make up ``failure_rate`` of at least ``min_runs`` runs in the last ``window_s``. An open
    breaker lets nothing through; once ``open_s`` has passed a probe is due, and only the
    probe's success closes it (a failed probe doubles the wait, up to ``max_open_s``). Live
    requests are never the probe: a request is answered at most once, by a level believed good.

    Thread-safe: the worker threads record runs, the loop reads :attr:`allows`. Every change
    of state and every failure goes through the lock; a success only counts itself
    (:meth:`succeeded`). :attr:`allows` is a plain attribute kept in step with the state,
    because it is read several times per request.

    Args:
        policy: thresholds.
        now: monotonic seconds (tests pass a fake clock).
    """

    def __init__(self, policy: BreakerPolicy, now: Callable[[], float]) -> None:
        self._policy = policy
        self._now = now
        self._held: str | None = None
        self._lock = threading.Lock()
        self._state = BreakerState.CLOSED
        self._consecutive = 0
        # The window as slices of window_s / _SLICES, [start, runs, failures] each: a success
        # costs an increment, not a tuple kept per run (20,000 of them at 2,000 runs/s); the
        # window's totals are summed over the slices when a failure needs them.
        self._slices: deque[list[float]] = deque()
        self._current: list[float] | None = None
        self._slice_s = policy.window_s / _SLICES
        self._opened_at = 0.0
        self._wait_s = policy.open_s
        self.reason = ""
        """Why the breaker last opened or was held ("" while it never has)."""
        self.allows = True
        """Whether live traffic may run on the level now: closed, and not held by :meth:`hold`."""

    @property
    def state(self) -> BreakerState:
        return self._state

    def hold(self, reason: str | None) -> None:
        """Keep live traffic off the level while ``reason`` is not None (its device is
        unhealthy), whatever the state; None lets it back when the breaker is closed."""
        with self._lock:
            self._held = reason
            if reason is not None:
                self.reason = reason
            self._settle()

    def _settle(self) -> None:
        """Under the lock, after any change of state or hold."""
        self.allows = self._state is BreakerState.CLOSED and self._held is None

    def probe_at(self) -> float | None:
        """When the next probe is due (None while closed or probing)."""
        if self._state is not BreakerState.OPEN:
            return None
        return self._opened_at + self._wait_s

    def record(self, failure: FailureKind | None) -> bool:
        """One live run's outcome (None: success); True when this run opened the breaker."""
        if failure is None:
            self.succeeded()
            return False
        now = self._now()
        with self._lock:
            current = self._current
            if current is None or now - current[0] >= self._slice_s:
                current = self._next_slice(now)
            current[1] += 1
            current[2] += 1
            if failure is FailureKind.PERSISTENT:
                self._consecutive += 1
            if self._state is not BreakerState.CLOSED:
                return False
            return self._maybe_open(now)

    def succeeded(self) -> None:
        """One live run's success: every good batch pays this, so it takes the lock only to
        start a slice (once per ``window_s / 20``).

        The two updates outside the lock are safe enough by design: under the GIL an
        increment is not interleaved with another thread's in practice, and if it were, the
        window would count one run fewer; a success racing a failure may leave the failure's
        consecutive count in place, as if the failure had come second.
        """
        now = self._now()
        current = self._current
        if current is None or now - current[0] >= self._slice_s:
            with self._lock:
                current = self._next_slice(now)
        current[1] += 1
        self._consecutive = 0

    def begin_probe(self) -> bool:
        """Claim the due probe; False when none is due or another thread took it."""
        with self._lock:
            due = self.probe_at()
            if due is None or self._now() < due:
                return False
            self._state = BreakerState.HALF_OPEN
            self._settle()
            return True

    def end_probe(self, succeeded: bool, reason: str = "") -> None:
        """Close after a good probe; reopen, waiting twice as long, after a failed one."""
        with self._lock:
            if succeeded:
                self._state = BreakerState.CLOSED
                self._consecutive = 0
                self._slices.clear()
                self._current = None
                self._wait_s = self._policy.open_s
                self._settle()
                return
            self._wait_s = min(self._wait_s * 2, self._policy.max_open_s)
            self._open(self._now(), reason or self.reason)

    def trip(self, reason: str) -> None:
        """Open at once (a device reported unhealthy, or a level failed to build)."""
        with self._lock:
            if self._state is BreakerState.CLOSED:
                self._open(self._now(), reason)

    def _maybe_open(self, now: float) -> bool:
        p = self._policy
        if self._consecutive >= p.consecutive_failures:
            self._open(now, f"{self._consecutive} consecutive persistent failures")
            return True
        runs = failures = 0
        for _, slice_runs, slice_failures in self._slices:  # at most ~21 slices, on a failure only
            runs += int(slice_runs)
            failures += int(slice_failures)
        if runs >= p.min_runs and failures >= p.failure_rate * runs:
            self._open(now, f"{failures} of {runs} runs failed in {p.window_s:g} s")
            return True
        return False

    def _open(self, now: float, reason: str) -> None:
        self._state = BreakerState.OPEN
        self._opened_at = now
        self.reason = reason
        self._settle()

    def _next_slice(self, now: float) -> list[float]:
        """Start a slice at ``now`` and forget those that began a window or more ago (a run is
        forgotten at most one slice, 1/20 of the window, early or late)."""
        horizon = now - self._policy.window_s
        slices = self._slices
        while slices and slices[0][0] < horizon:
            slices.popleft()
        current = [now, 0, 0]
        slices.append(current)
        self._current = current
        return current
