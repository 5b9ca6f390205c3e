"""Transport back-pressure: stop reading sockets while the event loop is saturated.

One event loop does all protocol work. Past its capacity, reading and refusing requests
costs CPU the answers need: with small models, a refusal costs a sizeable fraction of a
served request (parsing the request line and headers in Python), so refusing at 4-8x the
capacity leaves little for the requests admitted (issue 10: 4% goodput with 3,000
connections). Not reading costs nothing: the requests wait in the kernel's socket buffers
and in the clients, and the loop spends its time on the requests it already has.

The signal is the loop's own lag: a timer that should fire every ``_SAMPLE_S`` is late by
the time the loop spent in its longest stretch of callbacks meanwhile. A timer is also late
when the process was not scheduled at all (a busy machine, a container's CPU quota); then
the loop's thread used little CPU meanwhile, and not reading would only add to the delay. So
the loop counts as saturated when the timer is more than ``high_s`` late *and* the loop's
thread spent at least half of that on the CPU; every connection that delivers data is then
parked (reading paused) after that data is handled. Once the lag is back under
``high_s / 2``, or the loop's thread was mostly off the CPU, the parked connections are
resumed, the longest parked first, a bounded number per sample so a burst of resumed
connections cannot saturate the loop again at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Protocol

__all__ = ["IntakeGovernor", "Parkable"]

logger = logging.getLogger(__name__)

_SAMPLE_S = 0.005
_RESUME_PER_SAMPLE = 256


class Parkable(Protocol):
    """A connection whose reading the governor may pause and resume."""

    def park(self) -> None:
        """Stop reading until :meth:`unpark` (handling what was read goes on)."""
        ...

    def unpark(self) -> None:
        """Read again, unless the connection has reasons of its own to wait."""
        ...


class IntakeGovernor:
    """Parks connections while the loop lags more than ``high_s`` (0: never).

    Args:
        high_s: loop lag above which the loop counts as saturated.
    """

    def __init__(self, high_s: float) -> None:
        self.high_s = high_s
        self.low_s = high_s / 2
        self.saturated = False
        self.lag_s = 0.0
        self.episodes = 0  # times the loop became saturated
        self.parked_total = 0  # connections parked, over the server's life
        self._parked: OrderedDict[Parkable, None] = OrderedDict()
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._cpu = 0.0  # the loop thread's CPU time at the last sample
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def enabled(self) -> bool:
        return self.high_s > 0

    @property
    def parked(self) -> int:
        """Connections whose reading is paused now."""
        return len(self._parked)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Begin sampling the loop's lag (nothing when disabled)."""
        if not self.enabled or self._timer is not None:
            return
        self._loop = loop
        self._cpu = time.thread_time()
        self._due = loop.time() + _SAMPLE_S
        self._timer = loop.call_at(self._due, self._sample)

    def stop(self) -> None:
        """Stop sampling and resume every parked connection (shutdown drains them)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.saturated = False
        self._resume(len(self._parked))

    def admit_more(self, connection: Parkable) -> None:
        """Called by a connection after handling data it read: parks it when saturated."""
        if self.saturated and connection not in self._parked:
            self._parked[connection] = None
            self.parked_total += 1
            connection.park()

    def forget(self, connection: Parkable) -> None:
        """``connection`` closed: it no longer waits to be resumed."""
        self._parked.pop(connection, None)

    def _sample(self) -> None:
        assert self._loop is not None
        now, cpu = self._loop.time(), time.thread_time()
        self.lag_s = lag = max(0.0, now - self._due)
        busy = cpu - self._cpu  # the loop thread's own work since the last sample
        self._cpu = cpu
        if not self.saturated and lag > self.high_s and busy > self.high_s / 2:
            self.saturated = True
            self.episodes += 1
            logger.debug("event loop saturated (lag %.1f ms): parking connections", lag * 1e3)
        elif self.saturated and (lag < self.low_s or busy < self.low_s / 2):
            self.saturated = False
        if not self.saturated:
            self._resume(_RESUME_PER_SAMPLE)
        self._due = now + _SAMPLE_S
        self._timer = self._loop.call_at(self._due, self._sample)

    def _resume(self, count: int) -> None:
        for _ in range(min(count, len(self._parked))):
            connection, _ = self._parked.popitem(last=False)
            connection.unpark()
