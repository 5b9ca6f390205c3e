"""The unread-wait estimate: the measured part within the loop's iteration plus half the
previous iteration's read stretch, left where the loop's schedulers read it."""

from __future__ import annotations

import asyncio

import pytest

from ortserve.core.read_delay import ReadDelay, read_delay_of
from ortserve.server.read_lag import ReadLag, read_lag_of


class Ticks:
    """A loop clock (one reading per iteration) and a precise clock, both set by the test."""

    def __init__(self) -> None:
        self.iteration = 0.0
        self.now = 0.0

    def time(self) -> float:
        return self.iteration


def meter(ticks: Ticks, delay: ReadDelay) -> ReadLag:
    return ReadLag(ticks, delay, lambda: ticks.now)  # type: ignore[arg-type]


def test_a_head_read_late_in_an_iteration_waited_for_the_reads_before_it() -> None:
    ticks, delay = Ticks(), ReadDelay()
    lag = meter(ticks, delay)
    ticks.iteration, ticks.now = 1.0, 1.000
    assert lag.observe() == pytest.approx(0.0)  # the first read after the poll
    ticks.now = 1.030
    assert lag.observe() == pytest.approx(0.030)  # 30 ms of other connections before it
    assert delay.unread_s == pytest.approx(0.030)


def test_the_next_iteration_adds_half_the_previous_read_stretch() -> None:
    ticks, delay = Ticks(), ReadDelay()
    lag = meter(ticks, delay)
    ticks.iteration, ticks.now = 1.0, 1.000
    lag.observe()
    ticks.now = 1.040
    lag.observe()  # a 40 ms stretch: data arriving meanwhile waited 20 ms on average
    ticks.iteration, ticks.now = 1.05, 1.050
    assert lag.observe() == pytest.approx(0.020)
    ticks.now = 1.060
    assert lag.observe() == pytest.approx(0.030)
    assert lag.iterations == 2 and lag.reads == 4
    assert lag.take_maxima() == pytest.approx((0.040, 0.040))
    assert lag.take_maxima() == pytest.approx((0.010, 0.0))  # reset at each scrape


def test_an_idle_loop_reads_with_no_wait() -> None:
    ticks, delay = Ticks(), ReadDelay()
    lag = meter(ticks, delay)
    for second in range(1, 5):  # one request a second, each alone in its iteration
        ticks.iteration = ticks.now = float(second)
        assert lag.observe() == 0.0


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
