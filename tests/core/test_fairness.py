"""A model's queue shared by tenants: a flooding tenant and a quiet one, with a fake executor
and a fake clock (no sleeps, no real model)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import numpy as np
import pytest

from fake_executor import BatchRecorder, FakeExecutor
from ortserve.core.costmodel import BatchCostModel
from ortserve.core.fairness import tenant_key
from ortserve.core.policy import SchedulingPolicy
from ortserve.core.scheduler import Scheduler
from ortserve.errors import DeadlineExceeded, Overloaded
from ortserve.testing import FakeClock

Feeds = dict[str, np.ndarray]

QUIET = 10_000.0  # the quiet tenant's rows start here, the flood's below


def rows(n: int, start: float = 0.0) -> Feeds:
    return {"x": np.arange(n * 4, dtype=np.float32).reshape(n, 4) + start}


def make(cost: BatchCostModel | None = None, **policy: Any) -> tuple[Scheduler, FakeExecutor, FakeClock]:
    executor = FakeExecutor()
    clock = FakeClock()
    settings = {"max_batch_size": 4, **policy}
    scheduler = Scheduler(
        executor, SchedulingPolicy(**settings), clock, asyncio.get_running_loop(), cost, BatchRecorder()
    )
    return scheduler, executor, clock


def fitted_cost(per_row_s: float) -> BatchCostModel:
    cost = BatchCostModel()
    for n in (1, 8):
        cost.observe(n, per_row_s * n)
    return cost


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def quiet_rows_in(batch: Feeds) -> int:
    return int((batch["x"][:, 0] >= QUIET).sum())


@pytest.mark.parametrize("depth", [8, 100, 1000])
async def test_a_quiet_tenants_request_goes_in_the_next_batch_however_deep_the_flood(depth: int) -> None:
    scheduler, executor, _ = make(max_queue_size=2048)
    flood = [scheduler.submit(rows(1, i), 1, tenant="flood") for i in range(depth)]
    await settle()  # the first batch runs; the rest of the flood is queued
    quiet = scheduler.submit(rows(1, QUIET), 1, tenant="quiet")
    executor.finish()
    await settle()
    assert quiet_rows_in(executor.batches[1]) == 1
    assert executor.batches[1]["x"].shape[0] == min(4, depth - 4 + 1)  # the flood fills the rest
    executor.finish()
    np.testing.assert_array_equal((await quiet)[0], rows(1, QUIET)["x"] * 2)
    assert all(f.done() for f in flood[:7])  # two batches: 4 of the flood, then 3 beside the quiet one


async def test_each_tenant_with_queued_work_gets_an_equal_share_of_every_batch() -> None:
    scheduler, executor, _ = make(max_batch_size=8)
    scheduler.submit(rows(1), 1, tenant="a")
    await settle()
    for i in range(40):
        scheduler.submit(rows(1, 1 + i), 1, tenant="a")
    for i in range(8):
        scheduler.submit(rows(1, QUIET + i), 1, tenant="b")
    for _ in range(2):
        executor.finish()
        await settle()
    assert [quiet_rows_in(b) for b in executor.batches[1:]] == [4, 4]


async def test_an_unbatched_model_takes_the_tenants_in_turn() -> None:
    scheduler, executor, _ = make(max_batch_size=0)
    scheduler.submit(rows(1), 1, tenant="flood")
    await settle()
    for i in range(50):
        scheduler.submit(rows(1, 1 + i), 1, tenant="flood")
    quiet = [scheduler.submit(rows(1, QUIET + i), 1, tenant="quiet") for i in range(2)]
    for _ in range(5):
        executor.finish()
        await settle()
    assert [quiet_rows_in(b) for b in executor.batches[1:5]] == [0, 1, 0, 1]
    assert all(q.done() for q in quiet)


async def test_the_urgent_lane_still_goes_first_between_tenants() -> None:
    scheduler, executor, _ = make(max_batch_size=1)
    scheduler.submit(rows(1), 1, tenant="a")
    await settle()
    scheduler.submit(rows(1, 10), 1, priority=2, tenant="a")
    scheduler.submit(rows(1, QUIET), 1, priority=2, tenant="b")
    scheduler.submit(rows(1, 20), 1, priority=1, tenant="a")
    executor.finish()
    await settle()
    assert executor.batches[1]["x"][0, 0] == 20


async def test_a_tenant_holding_its_share_is_refused_while_another_is_queued() -> None:
    scheduler, _, _ = make(max_queue_size=10)
    scheduler.submit(rows(1), 1, tenant="flood")  # runs
    await settle()
    scheduler.submit(rows(1, QUIET), 1, tenant="quiet")
    for i in range(5):
        scheduler.submit(rows(1, 1 + i), 1, tenant="flood")
    with pytest.raises(Overloaded, match="share of the queue") as caught:
        scheduler.submit(rows(1, 9), 1, tenant="flood")
    assert caught.value.retry_after_s >= 0
    scheduler.submit(rows(1, QUIET + 1), 1, tenant="quiet")  # under its share


async def test_a_full_queue_pushes_out_the_floods_newest_for_a_tenant_under_its_share() -> None:
    scheduler, _, _ = make(max_queue_size=10)
    scheduler.submit(rows(1), 1, tenant="flood")
    await settle()
    flood = [scheduler.submit(rows(1, 1 + i), 1, tenant="flood") for i in range(10)]
    with pytest.raises(Overloaded, match="queue full"):
        scheduler.submit(rows(1, 11), 1, tenant="flood")
    quiet = scheduler.submit(rows(1, QUIET), 1, tenant="quiet")
    await settle()
    assert scheduler.queue_depth == 10
    with pytest.raises(Overloaded, match="pushed out"):
        await flood[-1]
    assert not quiet.done() and not any(f.done() for f in flood[:-1])


async def test_the_wait_that_refuses_the_flood_admits_the_quiet_tenant() -> None:
    # 10 ms a row, batches of 8 (80 ms), a 300 ms queue-wait target: the flood is refused
    # once 4 of its batches are ahead, but round-robin puts only one batch ahead of the quiet one.
    scheduler, _, _ = make(cost=fitted_cost(0.010), max_batch_size=8, max_queue_wait_s=0.300)
    with pytest.raises(Overloaded, match="queue-wait target"):
        for _ in range(100):
            scheduler.submit(rows(8), 8, tenant="flood")
    quiet = scheduler.submit(rows(8, QUIET), 8, tenant="quiet")
    assert not quiet.done()


async def test_with_tenancy_on_an_edge_refusal_is_checked_against_the_requests_tenant() -> None:
    scheduler, _, _ = make(max_queue_size=2)
    scheduler.submit(rows(1), 1, tenant="flood")
    await settle()
    for i in range(2):
        scheduler.submit(rows(1, 1 + i), 1, tenant="flood")
    assert isinstance(scheduler.refusal(), Overloaded)  # the edge knows no tenant (gRPC)
    assert isinstance(scheduler.refusal(1, lambda: "flood"), Overloaded)
    assert scheduler.refusal(1, lambda: "quiet") is None  # a full queue makes room for it
    with pytest.raises(Overloaded):
        scheduler.submit(rows(1, 9), 1, tenant="flood")
    scheduler.submit(rows(1, QUIET), 1, tenant="quiet")
    assert isinstance(scheduler.refusal(1, lambda: "flood"), Overloaded)


async def test_an_edge_refusal_asks_the_tenant_only_when_tenancy_is_on_and_it_refuses() -> None:
    asked: list[int] = []

    def tenant_of() -> str:
        asked.append(1)
        return "a"

    scheduler, _, _ = make(max_queue_size=1)
    scheduler.submit(rows(1), 1)
    await settle()
    assert scheduler.refusal(1, tenant_of) is None
    scheduler.submit(rows(1, 1), 1)
    assert isinstance(scheduler.refusal(1, tenant_of), Overloaded)
    assert asked == []  # tenancy off: never asked


async def _script(tenant: str | None, seed: int) -> tuple[list[np.ndarray], list[str]]:
    """A random run of one tenant's submissions, runs, clock steps and cancels: its batches
    and the outcome of every request."""
    rng = np.random.default_rng(seed)
    scheduler, executor, clock = make(
        cost=fitted_cost(0.001), max_queue_size=12, latency_budget_s=0.040, max_queue_wait_s=0.020
    )
    futures: list[asyncio.Future[Any]] = []
    refusals: list[str] = []
    for step in range(300):
        action = rng.integers(6)
        if action == 0:
            size = int(rng.choice([1, 1, 3]))
            try:
                futures.append(
                    scheduler.submit(rows(size, step), size, priority=int(rng.integers(3)), tenant=tenant)
                )
            except Overloaded as refused:
                refusals.append(str(refused))
        elif action == 1 and executor.running:
            executor.finish(seconds=float(rng.uniform(0.0005, 0.012)))
        elif action == 2:
            clock.advance(float(rng.uniform(0.0, 0.006)))
        elif action == 3:
            await settle()
        elif action == 4 and futures:
            futures[int(rng.integers(len(futures)))].cancel()
    while executor.running:
        executor.finish()
        await settle()
    outcomes = []
    for future in futures:
        if future.cancelled():
            outcomes.append("cancelled")
        elif not future.done():
            outcomes.append("pending")
        else:
            error = future.exception()
            outcomes.append(type(error).__name__ if error is not None else "served")
    return [b["x"] for b in executor.batches], refusals + outcomes


@pytest.mark.parametrize("seed", range(4))
async def test_a_single_tenant_is_served_exactly_as_with_tenancy_off(seed: int) -> None:
    off_batches, off_outcomes = await _script(None, seed)
    one_batches, one_outcomes = await _script("default", seed)
    assert one_outcomes == off_outcomes
    assert len(one_batches) == len(off_batches)
    for one, off in zip(one_batches, off_batches, strict=True):
        np.testing.assert_array_equal(one, off)


@pytest.mark.parametrize("seed", range(6))
async def test_the_books_balance_under_any_interleaving_of_tenants(seed: int) -> None:
    """Random tenants, sizes, lanes, runs, cancels and deadlines: every request is answered
    once the runs end, and the per-tenant counts always sum to the queue's."""
    rng = np.random.default_rng(seed)
    scheduler, executor, clock = make(cost=fitted_cost(0.001), max_queue_size=16, default_timeout_s=0.05)
    futures: list[asyncio.Future[Any]] = []
    backlog = scheduler._backlog
    for step in range(400):
        action = rng.integers(6)
        if action <= 1:
            size = int(rng.choice([1, 2, 4]))
            with contextlib.suppress(Overloaded):
                futures.append(
                    scheduler.submit(
                        rows(size, step),
                        size,
                        priority=int(rng.integers(3)),
                        tenant=str(rng.choice(["a", "a", "a", "b", "c"])),
                    )
                )
        elif action == 2 and executor.running:
            executor.finish()
        elif action == 3:
            clock.advance(float(rng.uniform(0.0, 0.01)))
        elif action == 4:
            await settle()
        elif futures:
            futures[int(rng.integers(len(futures)))].cancel()
        shares = backlog.shares
        if shares is None:  # one tenant's work queued (or none): nothing more is kept
            queued = {tenant_key(p) for lane in backlog.lanes for p in lane.queue if p.live}
            assert queued <= {backlog.solo}
        else:
            assert sum(shares.requests.values()) == backlog.queued_requests
            assert sum(shares.rows.values()) == backlog.queued_rows
    for _ in range(200):
        if executor.running:
            executor.finish()
        clock.advance(0.01)
        await settle()
    assert all(f.done() for f in futures)
    assert backlog.queued_requests == 0 and backlog.shares is None
    for future in futures:
        if not future.cancelled() and future.exception() is not None:
            assert isinstance(future.exception(), DeadlineExceeded | Overloaded)
