"""Reading and refusing before running: admitted requests run after the loop's reads, a
bounded stretch of them per loop iteration.

An HTTP connection that reads a whole admitted request used to run its handler at once
(decode, validate, submit) inside ``data_received``, so one loop iteration took as long as
the sum of every admitted request read in it, and a connection readable late in the
iteration waited through all of them before it was read (or refused). Here the connection
leaves the request on its own queue and hands itself to the loop's :class:`RunQueue`; the
queue runs the waiting connections from one callback scheduled with ``call_soon``, which the
loop calls after the current iteration's reads, and stops after its budget of handler work:
whatever is left runs in the next iteration, after that iteration's reads. The budget is the
longer of ``budget_s`` (2 ms) and the stretch since the previous turn (the reads and
refusals in between): under overload the loop alternates equal stretches of reading and
running, so a connection that becomes readable waits at most as long again as the reads
before it (and, under overload, is refused from its first bytes), and the admitted requests
still get half the loop. A fixed 2 ms starved them: with every iteration reading hundreds of
connections, the requests waiting for a turn grew without bound, unseen by admission (small_mlp,
1,600 connections at 4x: every request timed out, where running them inline answered some).

A connection's verdict was taken when its head was read; by the time it runs, the handlers
before it in the same turn may have filled the queue, so it is asked again before its body
is decoded (:meth:`Runnable.run_deferred`), and refused then at the cost of a refusal, not
of a decoded request.

The queue also keeps what the loop's HTTP connections do per iteration, for "where the time
goes" (exported at scrape time by :class:`~ortserve.server.intake_metrics.IntakeMetrics`):
connections accepted and the largest burst accepted in one iteration, and the times a client
not reading its answers paused writing.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Protocol

__all__ = ["DEFAULT_BUDGET_S", "RunQueue", "Runnable", "run_queue_of", "run_queues"]

DEFAULT_BUDGET_S = 0.002
"""The least handler work per loop iteration before the loop reads again. A heavy_mlp JSON request is
decoded and submitted in about 50-100 us, so 2 ms is 20-40 of them: enough to fill a batch
per iteration, short against the 20 ms a refusal may take."""


class Runnable(Protocol):
    """A connection holding a request it has read and not yet run."""

    def run_deferred(self) -> None:
        """Run what it holds (answers or hands on to the scheduler); nothing when closed."""
        ...


class RunQueue:
    """The loop's admitted requests waiting for the end of the reads, run a budget at a time.

    Args:
        loop: the loop whose iterations are bounded.
        budget_s: the least handler time per turn (a turn may run as long as the reads before
            it took); the turn stops at the first request that ends past its budget (at least
            one request runs per turn).
        clock: the precise clock (tests pass their own).
    """

    __slots__ = (
        "__weakref__",
        "_budget_s",
        "_burst",
        "_burst_at",
        "_clock",
        "_loop",
        "_scheduled",
        "_since",
        "_waiting",
        "accept_burst_max",
        "accepts",
        "carried",
        "ran",
        "turn_max_s",
        "turns",
        "write_pauses",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        budget_s: float = DEFAULT_BUDGET_S,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._loop = loop
        self._budget_s = budget_s
        self._clock = clock
        self._waiting: deque[Runnable] = deque()
        self._scheduled = False
        self._since = 0.0  # the end of the previous turn that left work, or the first deferral since
        self.ran = 0
        """Requests run after the reads, over the loop's life."""
        self.turns = 0
        """Turns taken (one per loop iteration with admitted requests waiting)."""
        self.carried = 0
        """Turns that reached the budget with requests still waiting (run next iteration)."""
        self.turn_max_s = 0.0
        """The longest turn since the last :meth:`take_max`."""
        self.accepts = 0
        """Connections accepted, over the loop's life."""
        self.accept_burst_max = 0
        """The most connections accepted in one loop iteration since the last :meth:`take_max`."""
        self.write_pauses = 0
        """Times a connection's transport paused writing (its client not reading)."""
        self._burst = 0
        self._burst_at = -1.0

    def accepted(self) -> None:
        """A connection was accepted (the loop's time stands still within one iteration)."""
        self.accepts += 1
        now = self._loop.time()
        if now != self._burst_at:
            self._burst_at, self._burst = now, 0
        self._burst += 1
        if self._burst > self.accept_burst_max:
            self.accept_burst_max = self._burst

    @property
    def waiting(self) -> int:
        """Connections waiting for their turn now."""
        return len(self._waiting)

    def defer(self, connection: Runnable) -> None:
        """Run ``connection``'s request after this iteration's reads (or a later one's)."""
        self._waiting.append(connection)
        if not self._scheduled:
            self._scheduled = True
            self._since = self._clock()
            self._loop.call_soon(self._turn)

    def _turn(self) -> None:
        waiting, clock = self._waiting, self._clock
        started = clock()
        ends = started + max(self._budget_s, started - self._since)  # as long as the reads, at least
        ran = 0
        now = started
        while waiting:
            waiting.popleft().run_deferred()
            ran += 1
            now = clock()
            if now >= ends:
                break
        self.ran += ran
        self.turns += 1
        if now - started > self.turn_max_s:
            self.turn_max_s = now - started
        if waiting:  # the rest after the next iteration's reads
            self.carried += 1
            self._since = now
            self._loop.call_soon(self._turn)
        else:
            self._scheduled = False

    def take_max(self) -> tuple[float, int]:
        """The longest turn and the largest accept burst since the last call (a scrape), reset."""
        longest, self.turn_max_s = self.turn_max_s, 0.0
        burst, self.accept_burst_max = self.accept_burst_max, 0
        return longest, burst


_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, RunQueue] = weakref.WeakKeyDictionary()


def run_queue_of(loop: asyncio.AbstractEventLoop) -> RunQueue:
    """``loop``'s run queue, made on first use (every HTTP listener on a loop shares it)."""
    queue = _BY_LOOP.get(loop)
    if queue is None:
        queue = _BY_LOOP[loop] = RunQueue(loop)
    return queue


def run_queues() -> list[RunQueue]:
    """Every live loop's run queue (a server process has one loop)."""
    return list(_BY_LOOP.values())
