"""The run queue bounds the handler work of each loop iteration (issue 30), on a fake loop and
a fake clock: each request's run advances the clock by its cost, and an iteration is the reads
the test makes, then the callbacks the loop had ready before them."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import cast

from ortserve.server.http.run_queue import RunQueue


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Loop:
    """Only ``call_soon``: callbacks wait for the next iteration."""

    def __init__(self) -> None:
        self.ready: list[Callable[[], None]] = []
        self.now = 0.0

    def time(self) -> float:
        return self.now

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.ready.append(callback)

    def iterate(self, reads: Callable[[], None] = lambda: None) -> None:
        """One iteration: what was ready runs, then the poll's reads (libuv: idle, then poll)."""
        ready, self.ready = self.ready, []
        for callback in ready:
            callback()
        reads()


class Request:
    def __init__(self, name: str, cost_s: float, clock: Clock, log: list[tuple[str, float]]) -> None:
        self.name, self.cost_s, self.clock, self.log = name, cost_s, clock, log

    def run_deferred(self) -> None:
        self.log.append((self.name, self.clock.now))
        self.clock.now += self.cost_s


def make(budget_s: float = 0.003) -> tuple[RunQueue, Loop, Clock, list[tuple[str, float]]]:
    loop, clock = Loop(), Clock()
    return RunQueue(cast(asyncio.AbstractEventLoop, loop), budget_s, clock), loop, clock, []


def test_a_turn_stops_at_the_budget_and_the_rest_runs_after_the_next_reads() -> None:
    queue, loop, clock, log = make(budget_s=0.003)
    for number in range(10):
        queue.defer(Request(f"r{number}", 0.001, clock, log))
    assert len(loop.ready) == 1  # one turn per iteration, however many wait
    loop.iterate()
    assert [name for name, _ in log] == ["r0", "r1", "r2"]  # 3 ms of 1 ms requests
    assert queue.waiting == 7 and len(loop.ready) == 1

    def reads() -> None:  # the next iteration's poll: a refusal is written, a request deferred
        log.append(("read", clock.now))
        queue.defer(Request("late", 0.001, clock, log))

    loop.iterate(reads)  # the turn runs r3-r5, then the poll reads
    loop.iterate()  # r6-r8 run after those reads
    assert [name for name, _ in log][3:] == ["r3", "r4", "r5", "read", "r6", "r7", "r8"]
    while loop.ready:
        loop.iterate()
    assert [name for name, _ in log][-2:] == ["r9", "late"]  # first come, first run
    assert queue.ran == 11 and queue.carried == 3 and queue.turns == 4


def test_every_readable_connection_waits_at_most_one_budget_of_handlers() -> None:
    queue, loop, clock, log = make(budget_s=0.002)
    reads_at: list[float] = []
    for number in range(50):
        queue.defer(Request(f"r{number}", 0.0007, clock, log))
    for _ in range(30):
        before = clock.now
        loop.iterate(lambda: reads_at.append(clock.now))
        # An iteration's handler work: the budget plus at most the one request that crossed it
        # (the reads here take no time, so the budget stays the least one).
        assert clock.now - before < 0.002 + 0.0007 + 1e-12
    gaps = [b - a for a, b in itertools.pairwise(reads_at)]
    assert max(gaps) < 0.0027 and queue.waiting == 0


def test_a_turn_runs_as_long_as_the_reads_before_it_so_reading_cannot_starve_the_admitted() -> None:
    queue, loop, clock, log = make(budget_s=0.002)
    for number in range(40):
        queue.defer(Request(f"r{number}", 0.001, clock, log))
    loop.iterate(lambda: setattr(clock, "now", clock.now + 0.010))  # 2 ms run, then 10 ms of reads
    assert len(log) == 2
    loop.iterate()  # the next turn gets the 10 ms the reads took
    assert len(log) == 12
    loop.iterate()  # no reads in between: back to the least budget
    assert len(log) == 14


def test_a_request_longer_than_the_budget_still_runs_one_per_turn() -> None:
    queue, loop, clock, log = make(budget_s=0.001)
    queue.defer(Request("big", 0.005, clock, log))
    queue.defer(Request("small", 0.0001, clock, log))
    loop.iterate()
    assert [name for name, _ in log] == ["big"]
    loop.iterate()
    assert [name for name, _ in log] == ["big", "small"] and not loop.ready
    assert queue.take_max() == (0.005, 0) and queue.take_max() == (0.0, 0)


def test_an_idle_queue_schedules_nothing_until_a_request_is_deferred() -> None:
    queue, loop, clock, log = make()
    queue.defer(Request("one", 0.0001, clock, log))
    loop.iterate()
    assert not loop.ready and queue.waiting == 0
    queue.defer(Request("two", 0.0001, clock, log))
    assert len(loop.ready) == 1


def test_an_accept_burst_is_the_accepts_of_one_iteration() -> None:
    queue, loop, _, _ = make()
    for _ in range(3):
        queue.accepted()
    loop.now = 1.0  # the next iteration
    queue.accepted()
    assert queue.accepts == 4 and queue.take_max() == (0.0, 3)
    queue.accepted()
    assert queue.take_max() == (0.0, 2)  # reset at each scrape; this iteration's count goes on
