"""A version with two instances and tenants: the last free instance is kept for a tenant with
nothing running while two tenants are active, so a quiet tenant's request starts at once beside
a flood instead of waiting for one of its batches to end (fake executor and clock)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from fake_executor import BatchRecorder, FakeExecutor
from ortserve.core.fairness import ACTIVE_S
from ortserve.core.policy import SchedulingPolicy
from ortserve.core.scheduler import Scheduler
from ortserve.testing import FakeClock

QUIET = 10_000.0  # the quiet tenant's rows start here, the flood's below


def rows(n: int, start: float = 0.0) -> dict[str, np.ndarray]:
    return {"x": np.arange(n * 4, dtype=np.float32).reshape(n, 4) + start}


def make(**policy: Any) -> tuple[Scheduler, FakeExecutor, FakeClock]:
    executor = FakeExecutor(instances=2)
    clock = FakeClock()
    settings = {"max_batch_size": 4, "max_queue_size": 1024, **policy}
    loop = asyncio.get_running_loop()
    scheduler = Scheduler(executor, SchedulingPolicy(**settings), clock, loop, None, BatchRecorder())
    return scheduler, executor, clock


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def quiet_rows(feeds: dict[str, np.ndarray]) -> int:
    return int((feeds["x"][:, 0] >= QUIET).sum())


async def flood(scheduler: Scheduler, n: int, tenant: str | None = "flood") -> list[asyncio.Future[Any]]:
    futures = [scheduler.submit(rows(1, i), 1, tenant=tenant) for i in range(n)]
    await settle()
    return futures


async def test_a_lone_tenant_takes_every_instance() -> None:
    for tenant in ("flood", None):  # tenancy on and off
        scheduler, executor, _ = make()
        await flood(scheduler, 12, tenant)
        assert len(executor.running) == 2


async def test_the_last_instance_is_kept_for_a_quiet_tenant_seen_lately() -> None:
    scheduler, executor, clock = make()
    quiet = scheduler.submit(rows(1, QUIET), 1, tenant="quiet")
    await settle()
    executor.finish()
    await settle()
    await quiet
    clock.advance(ACTIVE_S / 2)
    await flood(scheduler, 12)
    assert len(executor.running) == 1  # the flood holds one instance, not both
    quiet = scheduler.submit(rows(1, QUIET + 1), 1, tenant="quiet")
    await settle()
    assert len(executor.running) == 2  # it starts at once, beside the flood's batch
    assert quiet_rows(executor.running[1].feeds) == 1
    assert executor.running[1].feeds["x"].shape[0] == 1  # alone: no flood rows ride with it
    executor.finish(1)
    await settle()
    np.testing.assert_array_equal((await quiet)[0], rows(1, QUIET + 1)["x"] * 2)
    assert len(executor.running) == 1  # the freed instance is kept again


async def test_the_flood_takes_every_instance_again_once_the_quiet_tenant_is_gone() -> None:
    scheduler, executor, clock = make()
    scheduler.submit(rows(1, QUIET), 1, tenant="quiet")
    await settle()
    executor.finish()
    await settle()
    await flood(scheduler, 12)
    assert len(executor.running) == 1
    clock.advance(ACTIVE_S * 1.5)
    scheduler.submit(rows(1, 99), 1, tenant="flood")
    await settle()
    assert len(executor.running) == 2


async def test_two_floods_hold_one_instance_each() -> None:
    scheduler, executor, _ = make()
    await flood(scheduler, 12, "a")
    assert len(executor.running) == 2  # a alone so far
    for i in range(12):
        scheduler.submit(rows(1, QUIET + i), 1, tenant="b")
    await settle()
    for _ in range(3):  # while both have queued work: one batch of each running
        executor.finish()
        await settle()
        assert sorted(quiet_rows(job.feeds) > 0 for job in executor.running) == [False, True]
    executor.finish()  # a's last batch: a has nothing queued but is still active
    await settle()
    assert [quiet_rows(job.feeds) for job in executor.running] == [4]  # b keeps to one instance


async def test_a_batch_holding_both_tenants_keeps_no_instance_back() -> None:
    scheduler, executor, _ = make(max_batch_size=4)
    for i in range(8):  # in one tick, nothing running: the first batch takes both in turn
        scheduler.submit(rows(1, 1 + i), 1, tenant="a")
        scheduler.submit(rows(1, QUIET + i), 1, tenant="b")
    await settle()
    assert len(executor.running) == 2  # nobody left to keep the second instance for
    assert [quiet_rows(job.feeds) for job in executor.running] == [2, 2]
