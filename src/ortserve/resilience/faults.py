"""Fault injection for one execution level: errors, added latency, hangs, on a schedule."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

from ortserve.config.resilience import FaultConfig
from ortserve.resilience.classify import FailureKind, InjectedFault

__all__ = ["FaultInjector"]


class FaultInjector:
    """Called before each run of a level; sleeps and raises as its config says.

    Only built when the server runs with ``--enable-fault-injection``: a config's ``faults:``
    is otherwise ignored (with one warning at load), so a production config copied from a
    drill cannot break a model.

    Args:
        config: the level's faults.
        now: monotonic seconds; the ``cycle_s``/``active_s`` window counts from construction.
        sleep: blocking sleep (tests pass a fake one).
    """

    def __init__(
        self,
        config: FaultConfig,
        now: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._config = config
        self._now = now
        self._sleep = sleep
        self._start = now()
        self.started_at = self._start
        """Monotonic time the schedule counts from (drills line their clocks up on it)."""
        self._random = random.Random(config.seed)
        self._lock = threading.Lock()
        self._calls = 0
        self.injected = 0
        """Failures injected so far."""

    def active(self) -> bool:
        """Whether the faults apply now (always, unless a cycle window is configured)."""
        c = self._config
        elapsed = self._now() - self._start - c.offset_s
        if elapsed < 0:
            return False
        if c.cycle_s is None or c.active_s is None:
            return True
        return elapsed % c.cycle_s < c.active_s

    def before_run(self, level: str) -> None:
        """Apply the level's faults to the run about to start.

        Raises:
            InjectedFault: this run is to fail (after ``hang_ms`` when set).
        """
        c = self._config
        if not self.active():
            return
        if c.latency_ms:
            self._sleep(c.latency_ms / 1e3)
        with self._lock:
            self._calls += 1
            fails = (c.error_after is not None and self._calls > c.error_after) or (
                c.error_rate > 0 and self._random.random() < c.error_rate
            )
            if fails:
                self.injected += 1
        if not fails:
            return
        if c.hang_ms:
            self._sleep(c.hang_ms / 1e3)
        kind = FailureKind(c.kind)
        raise InjectedFault(kind, f"injected {kind.value} fault on {level}")
