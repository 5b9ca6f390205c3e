"""Estimating, as each request head is read, how long it sat unread in its socket.

The kernel's receive timestamps (``SO_TIMESTAMP``) need ``recvmsg``, which the loop's
transports do not use, and ``SIOCINQ`` tells bytes, not time. The loop's own rhythm tells
enough: one iteration polls the sockets once and then reads every readable one in turn, so
a request read late in an iteration waited, after the poll, for every connection read
before it; and it arrived at some point during the previous iteration, while the loop was
busy and not polling. The estimate is therefore

    unread = (now - the iteration's first read) + (the previous iteration's read stretch) / 2

the measured part plus the expected part for arrivals spread evenly over the previous
stretch. The loop's clock (``loop.time()``, updated once per iteration, in whole
milliseconds under uvloop) only tells iterations apart; the stretch itself is timed with
``time.monotonic``. Two iterations within the same millisecond count as one, which errs by
at most that millisecond.

The same readings show where an overloaded loop's time goes (exported at scrape time by
:class:`~ortserve.server.intake_metrics.IntakeMetrics`): iterations that read requests,
request heads read, the read stretches' total and longest, the unread waits' total and
longest.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable

from ortserve.core.read_delay import ReadDelay, read_delay_of

__all__ = ["ReadLag", "read_lag_of", "read_lags"]


class ReadLag:
    """The unread-wait estimate of one loop, and its statistics.

    Args:
        loop: the loop whose reads are timed.
        delay: where the latest estimate is left for the schedulers.
        clock: the precise clock (tests pass their own).
    """

    __slots__ = (
        "__weakref__",
        "_clock",
        "_delay",
        "_first",
        "_iteration",
        "_loop",
        "_previous_s",
        "_stretch_s",
        "iterations",
        "reads",
        "stretch_max_s",
        "stretch_total_s",
        "unread_max_s",
        "unread_total_s",
    )

    def __init__(
        self, loop: asyncio.AbstractEventLoop, delay: ReadDelay, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._loop = loop
        self._clock = clock
        self._delay = delay
        self._iteration = -1.0  # the loop's clock in the iteration being read
        self._first = 0.0  # when that iteration's first request head was read
        self._stretch_s = 0.0  # how far into the iteration the latest read came
        self._previous_s = 0.0  # the previous iteration's read stretch
        self.iterations = 0
        self.reads = 0
        self.stretch_total_s = 0.0
        self.stretch_max_s = 0.0
        self.unread_total_s = 0.0
        self.unread_max_s = 0.0

    def observe(self) -> float:
        """A request head was just read: its estimated unread wait (also left in the holder)."""
        now = self._clock()
        iteration = self._loop.time()
        if iteration != self._iteration:
            self._end_iteration()
            self.iterations += 1
            self._iteration = iteration
            self._first = now
        into = now - self._first
        if into > self._stretch_s:
            self._stretch_s = into
        unread = into + self._previous_s / 2
        self._delay.unread_s = unread
        self.reads += 1
        self.unread_total_s += unread
        if unread > self.unread_max_s:
            self.unread_max_s = unread
        return unread

    def _end_iteration(self) -> None:
        stretch = self._stretch_s
        self._previous_s = stretch
        self._stretch_s = 0.0
        self.stretch_total_s += stretch
        if stretch > self.stretch_max_s:
            self.stretch_max_s = stretch

    def take_maxima(self) -> tuple[float, float]:
        """The longest read stretch and unread wait since the last call (a scrape), reset."""
        maxima = (max(self.stretch_max_s, self._stretch_s), self.unread_max_s)
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
