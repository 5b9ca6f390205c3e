"""The unread-wait estimate: the measured part within the loop's iteration plus half the
loop's busy time since the previous iteration's first read, left where the loop's schedulers
read it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from ortserve.core.read_delay import ReadDelay, read_delay_of
from ortserve.server.read_lag import ReadLag, read_lag_of


class Ticks:
    """A loop whose ready callbacks the test runs (``next_iteration``), and the wall and CPU
    clocks, both set by the test."""

    def __init__(self) -> None:
        self.now = 0.0
        self.cpu = 0.0
        self.ready: list[Callable[[], None]] = []

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.ready.append(callback)

    def next_iteration(self) -> None:
        ready, self.ready = self.ready, []
        for callback in ready:
            callback()


def meter(ticks: Ticks) -> ReadLag:
    return ReadLag(ticks, ReadDelay(), lambda: ticks.now, lambda: ticks.cpu)  # type: ignore[arg-type]


def test_a_head_read_late_in_an_iteration_waited_for_the_reads_before_it() -> None:
    ticks = Ticks()
    delay = ReadDelay()
    lag = ReadLag(ticks, delay, lambda: ticks.now, lambda: ticks.cpu)  # type: ignore[arg-type]
    ticks.now = 1.000
    assert lag.observe() == pytest.approx(0.0)  # the first read after the poll
    ticks.now = ticks.cpu = 1.030
    assert lag.observe() == pytest.approx(0.030)  # 30 ms of other connections before it
    assert delay.unread_s == pytest.approx(0.030)


def test_the_next_iteration_adds_half_the_busy_time_since_the_last() -> None:
    ticks = Ticks()
    lag = meter(ticks)
    ticks.now = ticks.cpu = 1.000
    lag.observe()
    ticks.now = ticks.cpu = 1.040
    lag.observe()
    ticks.next_iteration()  # a 40 ms read stretch
    ticks.now = ticks.cpu = 1.060  # the handlers ran 20 ms more: 60 ms busy since the first read
    assert lag.observe() == pytest.approx(0.030)  # arrivals meanwhile waited 30 ms on average
    ticks.now = ticks.cpu = 1.070
    assert lag.observe() == pytest.approx(0.040)
    ticks.next_iteration()
    assert lag.iterations == 2 and lag.reads == 4
    assert lag.take_maxima() == pytest.approx((0.040, 0.040))
    assert lag.take_maxima() == pytest.approx((0.0, 0.0))  # reset at each scrape


def test_a_loop_asleep_in_its_poll_read_at_once() -> None:
    ticks = Ticks()
    lag = meter(ticks)
    for second in range(1, 5):  # one request a second, 1 ms of work each
        ticks.now = float(second)
        assert lag.observe() <= 0.0005
        ticks.cpu += 0.001
        ticks.next_iteration()


async def test_a_loops_meter_feeds_that_loops_schedulers_only() -> None:
    loop = asyncio.get_running_loop()
    assert read_lag_of(loop) is read_lag_of(loop)
    read_lag_of(loop).observe()
    other = asyncio.new_event_loop()
    try:
        assert read_delay_of(other) is not read_delay_of(loop)
        assert read_delay_of(other).unread_s == 0.0
    finally:
        other.close()
