"""Estimating, as each request head is read, how long it sat unread in its socket.

The kernel's receive timestamps (``SO_TIMESTAMP``) need ``recvmsg``, which the loop's
transports do not use, and ``SIOCINQ`` tells bytes, not time. The loop's own rhythm tells
enough: one iteration polls the sockets once and then reads every readable one in turn, so
a request read late in an iteration waited, after the poll, for every connection read
before it; and it arrived at some point while the loop was busy since the previous poll
(reading, then running the handlers and timers), not polling. The estimate is therefore

    unread = (now - this iteration's first read) + (the loop's busy time since the previous
             iteration's first read) / 2

the measured part plus the expected part for arrivals spread evenly over the busy time. The
busy time is the loop thread's CPU time over that interval, at most its wall time: a loop
asleep in its poll read what arrived at once. (On a machine that takes the CPU from the
server, the thread's CPU time undercounts the time it could not read: the estimate errs low.)

An iteration's reads are told apart by a callback scheduled at its first read, which the
loop runs after the iteration's reads and before its next poll (a ready callback).

The same readings show where an overloaded loop's time goes (exported at scrape time by
:class:`~ortserve.server.intake_metrics.IntakeMetrics`): iterations that read requests,
request heads read, the read stretches' total and longest (first to last read of an
iteration), the unread waits' total and longest.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable

from ortserve.core.read_delay import ReadDelay, read_delay_of

__all__ = ["ReadLag", "observe_read", "read_lag_of", "read_lags"]


class ReadLag:
    """The unread-wait estimate of one loop, and its statistics.

    Args:
        loop: the loop whose reads are timed.
        delay: where the latest estimate is left for the schedulers.
        clock: the precise wall clock (tests pass their own).
        cpu_clock: the loop thread's CPU time (tests pass their own).
    """

    __slots__ = (
        "__weakref__",
        "_before_s",
        "_clock",
        "_cpu_clock",
        "_delay",
        "_first",
        "_first_cpu",
        "_loop",
        "_reading",
        "iterations",
        "reads",
        "stretch_max_s",
        "stretch_total_s",
        "unread_max_s",
        "unread_total_s",
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
        self._reading = False  # this iteration has read a head (its end callback is due)
        self._first = -1.0  # when the iteration's first head was read (-1: none yet)
        self._first_cpu = 0.0  # the loop thread's CPU time then
        self._before_s = 0.0  # this iteration's expected wait before its poll
        self.iterations = 0
        self.reads = 0
        self.stretch_total_s = 0.0
        self.stretch_max_s = 0.0
        self.unread_total_s = 0.0
        self.unread_max_s = 0.0

    def observe(self) -> float:
        """A request head was just read: its estimated unread wait (also left in the holder)."""
        now = self._clock()
        if not self._reading:
            self._begin_iteration(now)
        unread = now - self._first + self._before_s
        self._delay.unread_s = unread
        self.reads += 1
        self.unread_total_s += unread
        if unread > self.unread_max_s:
            self.unread_max_s = unread
        return unread

    def _begin_iteration(self, now: float) -> None:
        self._reading = True
        self._loop.call_soon(self._end_iteration)
        cpu = self._cpu_clock()
        if self._first >= 0:
            busy = min(now - self._first, cpu - self._first_cpu)
            self._before_s = max(0.0, busy) / 2
        self._first, self._first_cpu = now, cpu
        self.iterations += 1

    def _end_iteration(self) -> None:
        """The iteration's reads are over (a ready callback, run before the next poll)."""
        self._reading = False
        stretch = self._clock() - self._first
        self.stretch_total_s += stretch
        if stretch > self.stretch_max_s:
            self.stretch_max_s = stretch

    def take_maxima(self) -> tuple[float, float]:
        """The longest read stretch and unread wait since the last call (a scrape), reset."""
        maxima = (self.stretch_max_s, self.unread_max_s)
        self.stretch_max_s = self.unread_max_s = 0.0
        return maxima


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
