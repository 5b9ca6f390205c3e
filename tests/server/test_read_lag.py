"""The unread-wait estimate: the loop's lag, sampled while requests arrive, left where the
loop's schedulers read it."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

import pytest

from ortserve.core.read_delay import ReadDelay, read_delay_of
from ortserve.server.read_lag import ReadLag, observe_read, read_lag_of


class BusyLoop:
    """A loop whose timers fire when the test lets it run them (``run_until``), late if it
    was busy meanwhile."""

    def __init__(self) -> None:
        self.now = 0.0
        self.cpu = 0.0  # the loop thread's CPU time
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def call_later(self, delay: float, callback: Callable[[], None]) -> object:
        heapq.heappush(self._timers, (self.now + delay, next(self._seq), callback))
        return callback  # a handle: the meter only checks that it holds one

    def run_until(self, when: float, on_cpu: bool = True) -> None:
        """Busy until ``when`` (on the CPU, or not scheduled): the timers that fell due
        meanwhile fire then."""
        if on_cpu:
            self.cpu += when - self.now
        self.now = when
        while self._timers and self._timers[0][0] <= when:
            heapq.heappop(self._timers)[2]()

    @property
    def armed(self) -> bool:
        return bool(self._timers)


def meter(loop: BusyLoop, delay: ReadDelay) -> ReadLag:
    return ReadLag(loop, delay, lambda: loop.now, lambda: loop.cpu)  # type: ignore[arg-type]


def test_a_loop_busy_past_a_sample_leaves_its_lateness_as_the_unread_wait() -> None:
    loop, delay = BusyLoop(), ReadDelay()
    lag = meter(loop, delay)
    lag.observe()  # at 0: the next sample is due at 5 ms
    lag.observe()
    loop.run_until(0.045)  # one 45 ms stretch of work
    assert delay.unread_s == pytest.approx(0.040)
    assert lag.samples == 1 and lag.reads == 2
    assert lag.take_max() == pytest.approx(0.040)
    assert lag.take_max() == 0.0  # reset at each scrape


def test_a_process_kept_off_the_cpu_is_a_slow_machine_not_a_late_read() -> None:
    loop, delay = BusyLoop(), ReadDelay()
    lag = meter(loop, delay)
    lag.observe()
    loop.run_until(0.001)
    loop.run_until(0.045, on_cpu=False)  # another process had the core for 44 ms
    assert delay.unread_s == pytest.approx(0.040 * 0.001 / 0.045)


def test_a_prompt_loop_reads_with_no_wait() -> None:
    loop, delay = BusyLoop(), ReadDelay()
    lag = meter(loop, delay)
    for _ in range(20):
        lag.observe()
        loop.run_until(loop.now + 0.005)  # every sample on time
        assert delay.unread_s == pytest.approx(0.0, abs=1e-6)


def test_sampling_stops_on_an_idle_loop_and_the_estimate_clears() -> None:
    loop, delay = BusyLoop(), ReadDelay()
    lag = meter(loop, delay)
    lag.observe()
    loop.run_until(0.030)
    assert delay.unread_s == pytest.approx(0.025)
    loop.run_until(0.040)  # nothing read since: the loop sleeps, no timer is left
    assert delay.unread_s == 0.0 and not loop.armed
    lag.observe()
    assert loop.armed


async def test_a_loops_meter_feeds_that_loops_schedulers_only() -> None:
    loop = asyncio.get_running_loop()
    assert read_lag_of(loop) is read_lag_of(loop)
    observe_read()
    assert read_lag_of(loop).reads == 1
    other = asyncio.new_event_loop()
    try:
        assert read_delay_of(other) is not read_delay_of(loop)
        assert read_delay_of(other).unread_s == 0.0
    finally:
        other.close()


def test_a_read_off_any_loop_is_not_timed() -> None:
    observe_read()  # unit tests call the transports' hooks without a loop
