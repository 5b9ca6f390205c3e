"""The adaptive concurrency limit: grows while latency stays at its no-load figure, shrinks in
proportion when latency rises, stays within its bounds."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from fake_executor import FakeExecutor
from ortserve.config.model import BatchingConfig
from ortserve.core.adaptive import AdaptiveLimit
from ortserve.core.policy import SchedulingPolicy
from ortserve.core.scheduler import Scheduler
from ortserve.errors import Overloaded
from ortserve.testing import FakeClock


def feed(limit: AdaptiveLimit, latency_s: float, windows: int) -> None:
    for _ in range(windows * 50):
        limit.observe(latency_s)


def test_steady_latency_lets_the_limit_grow_to_its_maximum() -> None:
    limit = AdaptiveLimit(16, 8, 200)
    feed(limit, 0.010, 1)
    grown = limit.limit
    assert grown > 16
    feed(limit, 0.010, 100)
    assert limit.limit == 200


def test_rising_latency_shrinks_the_limit_and_the_minimum_holds() -> None:
    limit = AdaptiveLimit(100, 8, 200)
    feed(limit, 0.010, 2)  # the no-load figure: 10 ms
    before = limit.limit
    seen = [before]
    while seen[-1] > 8 and len(seen) < 60:  # four times slower: queueing
        feed(limit, 0.040, 1)
        seen.append(limit.limit)
    assert seen == sorted(seen, reverse=True) and seen[1] < before
    assert seen[-1] == 8  # down to the minimum, never below it


def test_latency_within_the_tolerance_of_batching_is_not_congestion() -> None:
    limit = AdaptiveLimit(32, 8, 64)
    feed(limit, 0.010, 1)
    feed(limit, 0.014, 50)  # 1.4x the no-load figure: a batch's wait, not a queue
    assert limit.limit == 64


def test_the_no_load_figure_follows_a_lasting_change_upwards() -> None:
    limit = AdaptiveLimit(32, 8, 64)
    feed(limit, 0.010, 1)
    windows = 0
    while limit.limit > 8 and windows < 60:  # 10x slower for good: first taken for congestion
        feed(limit, 0.100, 1)
        windows += 1
    assert limit.limit == 8
    feed(limit, 0.100, 1)
    assert limit.no_load_s == pytest.approx(0.100)  # at the minimum, re-taught
    feed(limit, 0.100, 30)
    assert limit.limit == 64  # and the limit grows again


def test_config_accepts_adaptive_a_number_or_nothing() -> None:
    assert BatchingConfig(concurrency="adaptive").concurrency == "adaptive"
    assert BatchingConfig(concurrency=12).concurrency == 12
    assert BatchingConfig().concurrency is None
    with pytest.raises(ValueError):
        BatchingConfig(concurrency="lots")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        BatchingConfig(concurrency=0)


async def test_a_fixed_limit_refuses_beyond_the_requests_held() -> None:
    loop = asyncio.get_running_loop()
    executor = FakeExecutor()
    scheduler = Scheduler(executor, SchedulingPolicy(max_batch_size=1, concurrency=2), FakeClock(), loop)
    x: dict[str, np.ndarray] = {"x": np.zeros((1, 4), dtype=np.float32)}
    first = scheduler.submit(x, 1)
    for _ in range(3):
        await asyncio.sleep(0)
    second = scheduler.submit(x, 1)  # one running, one queued: two held
    with pytest.raises(Overloaded, match="concurrency limit"):
        scheduler.submit(x, 1)
    executor.finish()
    await first
    third = scheduler.submit(x, 1)  # the first left: room for one more
    executor.finish()
    await second
    for _ in range(3):
        await asyncio.sleep(0)
    executor.finish()
    await third


async def test_an_adaptive_limit_learns_from_the_requests_it_serves() -> None:
    loop = asyncio.get_running_loop()
    executor, clock = FakeExecutor(), FakeClock()
    policy = SchedulingPolicy(max_batch_size=1, max_queue_size=500, adaptive_concurrency=True)
    scheduler = Scheduler(executor, policy, clock, loop)
    assert scheduler.concurrency is not None
    start = scheduler.concurrency.limit
    x: dict[str, np.ndarray] = {"x": np.zeros((1, 4), dtype=np.float32)}
    for _ in range(120):  # one at a time, 2 ms each: no queue, so the limit grows
        future = scheduler.submit(x, 1)
        for _ in range(3):
            await asyncio.sleep(0)
        clock.advance(0.002)
        executor.finish()
        await future
    assert scheduler.concurrency.limit > start
