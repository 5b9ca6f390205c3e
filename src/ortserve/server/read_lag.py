"""Estimating how long request heads sit unread in their sockets: the loop's lag.

The kernel's receive timestamps (``SO_TIMESTAMP``) need ``recvmsg``, which the loop's
transports do not use, and ``SIOCINQ`` tells bytes, not time. The loop's lag tells enough: a
request that arrives while the loop is busy waits until the loop polls again, and one
iteration then reads every readable connection in turn. A timer due every ``_SAMPLE_S``
fires late by about the stretch of work the loop was in when it fell due, the same stretch
a request arriving then waits through before it is read; its lateness is the estimate each
read is given, scaled by the share of the interval the loop's thread was on the CPU. A timer
is also late when the process was not scheduled at all (a busy machine, a CPU quota): that is
a slower machine, not a loop behind its own work, and counted in full it refused a benign
load of 32 clients whenever another process took the core for 50 ms (the intake governor
draws the same line).

Timing each read instead (the time since its iteration's first read, plus the loop's busy
time before its poll) cost a ready callback and a CPU-clock read per iteration, 3 us, which
added 20% to a refusal (``bench_refusal_floor.py``: 18.8 against 15.7 us). Sampling costs a
counter per read and a timer per 5 ms while requests arrive; an idle loop is not woken.

The samples also show where an overloaded loop's time goes (exported at scrape time by
:class:`~ortserve.server.intake_metrics.IntakeMetrics`): request heads read, lag samples,
their total and their longest.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable

from ortserve.core.read_delay import ReadDelay, read_delay_of

__all__ = ["ReadLag", "observe_read", "read_lag_of", "read_lags"]

_SAMPLE_S = 0.005
"""How often the loop's lag is sampled while requests arrive."""


class ReadLag:
    """The unread-wait estimate of one loop (its lag while requests arrive), and its statistics.

    Args:
        loop: the loop whose lag is sampled.
        delay: where the latest estimate is left for the schedulers.
        clock: the precise clock (tests pass their own).
        cpu_clock: the loop thread's CPU time (tests pass their own).
    """

    __slots__ = (
        "__weakref__",
        "_clock",
        "_cpu",
        "_cpu_clock",
        "_delay",
        "_due",
        "_loop",
        "_reads_sampled",
        "_since",
        "_timer",
        "lag_max_s",
        "lag_total_s",
        "reads",
        "samples",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        delay: ReadDelay,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self._loop = loop
        self._delay = delay
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._since = 0.0  # when the current sample interval began
        self._cpu = 0.0  # the loop thread's CPU time then
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._reads_sampled = 0  # reads counted at the last sample
        self.reads = 0
        self.samples = 0
        self.lag_total_s = 0.0
        self.lag_max_s = 0.0

    def observe(self) -> None:
        """A request head was just read: sampling goes on (starts, on an idle loop)."""
        self.reads += 1
        if self._timer is None:
            self._arm(self._clock())

    def _arm(self, now: float) -> None:
        self._since, self._cpu = now, self._cpu_clock()
        self._due = now + _SAMPLE_S
        self._timer = self._loop.call_later(_SAMPLE_S, self._sample)

    def _sample(self) -> None:
        now = self._clock()
        elapsed = now - self._since
        on_cpu = (self._cpu_clock() - self._cpu) / elapsed if elapsed > 0 else 1.0
        lag = max(0.0, now - self._due) * min(1.0, on_cpu)
        self.samples += 1
        self.lag_total_s += lag
        if lag > self.lag_max_s:
            self.lag_max_s = lag
        if self.reads == self._reads_sampled:  # nothing read meanwhile: the loop is idle
            self._timer = None
            self._delay.unread_s = 0.0
            return
        self._reads_sampled = self.reads
        self._delay.unread_s = lag
        self._arm(now)

    def take_max(self) -> float:
        """The longest lag since the last call (a scrape), reset."""
        longest, self.lag_max_s = self.lag_max_s, 0.0
        return longest


_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ReadLag] = weakref.WeakKeyDictionary()


def read_lag_of(loop: asyncio.AbstractEventLoop) -> ReadLag:
    """``loop``'s meter, made on first use; it feeds ``loop``'s schedulers."""
    lag = _BY_LOOP.get(loop)
    if lag is None:
        lag = _BY_LOOP[loop] = ReadLag(loop, read_delay_of(loop))
    return lag


def read_lags() -> list[ReadLag]:
    """Every live loop's meter (a server process has one loop)."""
    return list(_BY_LOOP.values())


def observe_read() -> None:
    """A request head was just read on the running loop: time its unread wait (nothing off a
    loop: unit tests call the transports' hooks directly)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    read_lag_of(loop).observe()
