"""The automatic queue-wait target follows the measured service (issue 30): a closed loop that
holds no more than the batch capacity in flight is never refused, however slow the runner,
and a real overload is still refused and shed. Fake clock and executor: no sleeps."""

from __future__ import annotations

import asyncio
import bisect
import math

import numpy as np
import pytest

from fake_executor import BatchRecorder, FakeExecutor
from ortserve.core.adaptive import ServiceMeter
from ortserve.core.admission import in_flight_capacity
from ortserve.core.costmodel import BatchCostModel
from ortserve.core.policy import SchedulingPolicy
from ortserve.core.read_delay import read_delay_of
from ortserve.core.scheduler import Scheduler
from ortserve.errors import Overloaded
from ortserve.testing import FakeClock

Array = np.ndarray
BATCH = 8


def one_row() -> dict[str, Array]:
    return {"x": np.zeros((1, 4), dtype=np.float32)}


def fitted(per_row_s: float) -> BatchCostModel:
    cost = BatchCostModel()
    for n in (1, BATCH):
        cost.observe(n, per_row_s * n)
    return cost


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def run_closed_loop(
    clients: int, slowdown: float, read_s: float, seed: int, batches: int = 150
) -> tuple[int, int]:
    """``clients`` each keep one request in flight and send the next once the last is answered
    (or refused); the loop reads each next request some time within ``read_s`` of the answer
    (a busy machine), so batches start while part of the loop's requests are still unread,
    short ones among them. The runner takes ``slowdown`` times what the cost model learnt at
    start (5 ms a row: a full batch is 40 ms, so the target is two batches, not its 50 ms
    floor). Returns (answered, refused)."""
    executor, clock = FakeExecutor(), FakeClock()
    policy = SchedulingPolicy(max_batch_size=BATCH, max_queue_size=1024)
    scheduler = Scheduler(executor, policy, clock, asyncio.get_running_loop(), fitted(0.005))
    rng = np.random.default_rng(seed)
    due = sorted(clock.now() + rng.uniform(0.0, read_s, clients))
    futures: list[asyncio.Future[list[Array]]] = []
    answered = refused = finished = 0
    batch_end: float | None = None
    while finished < batches:
        await settle()
        if executor.running and batch_end is None:
            batch_end = clock.now() + 0.005 * slowdown * len(executor.running[0].feeds["x"])
        arrival = due[0] if due else math.inf
        if batch_end is None and arrival == math.inf:
            clock.advance(policy.max_queue_delay_s)  # the batching delay's timer
            continue
        if batch_end is not None and batch_end <= arrival:
            clock.advance(max(0.0, batch_end - clock.now()))
            seconds = 0.005 * slowdown * len(executor.running[0].feeds["x"])
            executor.finish(seconds=seconds)
            batch_end = None
            finished += 1
            await settle()
            for future in [f for f in futures if f.done()]:
                futures.remove(future)
                if isinstance(future.exception(), Overloaded):
                    refused += 1
                else:
                    future.result()
                    answered += 1
                bisect.insort(due, clock.now() + rng.uniform(0.0, read_s))
            continue
        clock.advance(max(0.0, arrival - clock.now()))
        due.pop(0)
        try:
            futures.append(scheduler.submit(one_row(), 1))
        except Overloaded:
            refused += 1
            bisect.insort(due, clock.now() + rng.uniform(0.0, read_s))
    return answered, refused


def test_the_capacity_in_flight_is_a_running_and_a_queued_batch_per_instance() -> None:
    assert in_flight_capacity(SchedulingPolicy(max_batch_size=32), 1) == 64
    assert in_flight_capacity(SchedulingPolicy(max_batch_size=32), 2) == 128
    assert in_flight_capacity(SchedulingPolicy(max_batch_size=0), 1) == 2
    assert in_flight_capacity(SchedulingPolicy(max_batch_size=32, max_queue_wait_s=0.1), 1) == 0


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("slowdown", [1.0, 3.0, 10.0])
async def test_a_closed_loop_within_the_capacity_in_flight_is_never_refused(
    seed: int, slowdown: float
) -> None:
    full_batch_s = 0.005 * slowdown * BATCH
    answered, refused = await run_closed_loop(2 * BATCH, slowdown, full_batch_s, seed)
    assert refused == 0
    assert answered > 100 * BATCH / 2  # and it is served, batch after batch


async def test_an_open_loop_beyond_the_service_rate_is_still_refused_and_the_queue_bounded() -> None:
    executor, clock = FakeExecutor(), FakeClock()
    policy = SchedulingPolicy(max_batch_size=BATCH, max_queue_size=1024)
    scheduler = Scheduler(executor, policy, clock, asyncio.get_running_loop(), fitted(0.001))
    refused = admitted = 0
    deepest = 0
    for _ in range(100):  # a full batch takes 40 ms (5x the prediction); 4x its rows arrive
        for _ in range(4 * BATCH):
            clock.advance(0.040 / (4 * BATCH))
            try:
                scheduler.submit(one_row(), 1)
                admitted += 1
            except Overloaded:
                refused += 1
        await settle()
        deepest = max(deepest, scheduler.queue_depth)
        if executor.running:
            executor.finish(seconds=0.040)
    assert refused > admitted  # about three in four refused
    assert deepest <= 4 * BATCH  # the queue-wait target holds the queue to a few batches


def test_the_service_meter_learns_how_much_slower_than_predicted_batches_are_served() -> None:
    meter = ServiceMeter()
    end = 0.0
    for _ in range(60):  # back to back: each batch served 30 ms where 10 ms was predicted
        meter.observe(end + 0.020, end - 0.005, end + 0.030, 0.010)
        end += 0.030
    assert meter.slowdown == pytest.approx(3.0, rel=0.01)


def test_an_idle_runner_is_not_slow_service() -> None:
    meter = ServiceMeter()
    for i in range(60):  # a request every second, served in its predicted 10 ms
        arrival = float(i)
        meter.observe(arrival, arrival, arrival + 0.010, 0.010)
    assert meter.slowdown == pytest.approx(1.0)


async def test_the_wait_unread_in_the_socket_counts_in_admission_beyond_the_capacity() -> None:
    loop = asyncio.get_running_loop()
    executor, clock = FakeExecutor(), FakeClock()
    policy = SchedulingPolicy(max_batch_size=BATCH, max_queue_size=1024)
    scheduler = Scheduler(executor, policy, clock, loop, fitted(0.005))  # target 80 ms
    for _ in range(BATCH):
        scheduler.submit(one_row(), 1)
    await settle()  # a full batch runs: 40 ms
    for _ in range(BATCH):  # the capacity in flight: admitted, however long unread
        read_delay_of(loop).unread_s = 1.0
        scheduler.submit(one_row(), 1)
    read_delay_of(loop).unread_s = 0.070  # beyond it: 80 ms queued and running + 70 ms unread
    with pytest.raises(Overloaded, match="unread"):
        scheduler.submit(one_row(), 1)
    assert scheduler.refusal() is not None
    read_delay_of(loop).unread_s = 0.0
    assert scheduler.refusal() is None  # a refusal by the unread wait is not kept
    scheduler.submit(one_row(), 1)  # 80 ms ahead: within the target


async def test_a_requests_wait_counts_from_before_it_was_read() -> None:
    loop = asyncio.get_running_loop()
    executor, clock = FakeExecutor(), FakeClock()
    recorder = BatchRecorder()
    policy = SchedulingPolicy(max_batch_size=BATCH)
    scheduler = Scheduler(executor, policy, clock, loop, fitted(0.005), recorder)
    read_delay_of(loop).unread_s = 0.025
    future = scheduler.submit(one_row(), 1)
    await settle()
    executor.finish()
    await future
    assert recorder.records[0].queue_waits_s == pytest.approx((0.025,))


async def test_an_unread_wait_within_one_batch_refuses_nothing() -> None:
    loop = asyncio.get_running_loop()
    executor, clock = FakeExecutor(), FakeClock()
    policy = SchedulingPolicy(max_batch_size=0)  # the capacity in flight: 2 requests
    scheduler = Scheduler(executor, policy, clock, loop, fitted(0.100))  # a request: 100 ms
    scheduler.submit(one_row(), 1)
    await settle()  # runs: 100 ms
    clock.advance(0.001)
    scheduler.submit(one_row(), 1)
    read_delay_of(loop).unread_s = 0.090  # the loop read it late, but by less than a run
    scheduler.submit(one_row(), 1)  # 199 ms ahead, target 200 ms: admitted
    read_delay_of(loop).unread_s = 0.0
    assert scheduler.queue_depth == 2
