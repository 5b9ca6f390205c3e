"""The bulk lane: beside an active quiet tenant, a flooding tenant's batches (every tenant of
the batch still has work queued) are marked ``bulk``, and the runner runs them on worker
threads of lower CPU weight (a higher nice), so the quiet tenant's run gets the core when both
are runnable. Fake executor and clock for the rule; a real session for the threads."""

from __future__ import annotations

import asyncio
import math
import os
import queue
import sys
import threading

import numpy as np
import onnxruntime as ort
import pytest

from fake_executor import BatchRecorder, FakeExecutor
from model_builders import failing_model, serialized
from ortserve.core.fairness import ACTIVE_S
from ortserve.core.job import BatchJob, RunResult
from ortserve.core.policy import SchedulingPolicy
from ortserve.core.runner import BULK_NICE, OrtRunner
from ortserve.core.scheduler import Scheduler
from ortserve.testing import FakeClock

QUIET = 10_000.0  # the quiet tenant's rows start here, the flood's below


def rows(n: int, start: float = 0.0) -> dict[str, np.ndarray]:
    return {"x": np.arange(n * 4, dtype=np.float32).reshape(n, 4) + start}


def make(instances: int = 2, max_batch_size: int = 4) -> tuple[Scheduler, FakeExecutor, FakeClock]:
    executor = FakeExecutor(instances=instances)
    clock = FakeClock()
    policy = SchedulingPolicy(max_batch_size=max_batch_size, max_queue_size=1024)
    scheduler = Scheduler(executor, policy, clock, asyncio.get_running_loop(), None, BatchRecorder())
    return scheduler, executor, clock


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def is_quiet(job: BatchJob) -> bool:
    return bool((np.asarray(job.feeds["x"], dtype=np.float32)[:, 0] >= QUIET).all())


async def quiet_seen(scheduler: Scheduler, executor: FakeExecutor) -> None:
    """The quiet tenant sends one request and has it answered."""
    future = scheduler.submit(rows(1, QUIET), 1, tenant="quiet")
    await settle()
    executor.finish()
    await settle()
    await future


async def flood(scheduler: Scheduler, n: int, tenant: str | None = "flood") -> None:
    for i in range(n):
        scheduler.submit(rows(1, i), 1, tenant=tenant)
    await settle()


async def test_a_flood_beside_an_active_quiet_tenant_runs_in_the_bulk_lane() -> None:
    scheduler, executor, _ = make()
    await quiet_seen(scheduler, executor)
    await flood(scheduler, 12)
    assert [job.bulk for job in executor.running] == [True]  # 4 requests of one tenant
    scheduler.submit(rows(1, QUIET + 1), 1, tenant="quiet")
    await settle()
    assert [(is_quiet(job), job.bulk) for job in executor.running] == [(False, True), (True, False)]
    executor.finish(0)  # the flood's next batch, chained
    await settle()
    assert [(is_quiet(job), job.bulk) for job in executor.running] == [(True, False), (False, True)]


async def test_the_floods_last_batch_and_a_lone_tenant_keep_the_full_weight() -> None:
    scheduler, executor, clock = make()
    await quiet_seen(scheduler, executor)
    await flood(scheduler, 9)  # batches of 4, 4 and 1
    for bulk in (True, True):
        assert [job.bulk for job in executor.running] == [bulk]
        executor.finish()
        await settle()
    assert [job.bulk for job in executor.running] == [False]  # one request, none queued behind it
    executor.finish()
    await settle()
    clock.advance(ACTIVE_S * 1.5)  # the quiet tenant is gone
    await flood(scheduler, 12)
    assert [job.bulk for job in executor.running] == [False, False]


@pytest.mark.parametrize("tenant", [None, "flood"])
async def test_nothing_is_bulk_without_another_tenant(tenant: str | None) -> None:
    scheduler, executor, _ = make()
    await flood(scheduler, 12, tenant)
    for _ in range(3):
        assert executor.running and not any(job.bulk for job in executor.running)
        executor.finish()
        await settle()


async def test_a_lone_request_with_more_of_its_tenant_queued_is_bulk() -> None:
    scheduler, executor, _ = make(max_batch_size=0)
    await quiet_seen(scheduler, executor)
    for i in range(3):  # one at a time as they come, in batches of one (max_batch_size 1)
        scheduler.submit(rows(1, i), 1, tenant="flood")
    await settle()
    scheduler.submit(rows(1, QUIET + 1), 1, tenant="quiet")
    await settle()
    assert [(is_quiet(job), job.bulk) for job in executor.running] == [(False, False), (True, False)]
    executor.finish(0)  # the flood's second batch, a request of one, with one more queued
    await settle()
    assert [(is_quiet(job), job.bulk) for job in executor.running] == [(True, False), (False, True)]


async def test_nothing_is_bulk_with_one_instance() -> None:
    scheduler, executor, _ = make(instances=1)
    await quiet_seen(scheduler, executor)
    await flood(scheduler, 12)
    assert [job.bulk for job in executor.running] == [False]


async def test_two_floods_both_run_in_the_bulk_lane() -> None:
    scheduler, executor, _ = make()
    await flood(scheduler, 12, "a")
    for i in range(12):
        scheduler.submit(rows(1, QUIET + i), 1, tenant="b")
    await settle()
    executor.finish()
    executor.finish()
    await settle()
    assert len(executor.running) == 2 and all(job.bulk for job in executor.running)


# -- the runner's threads -----------------------------------------------------------------
needs_thread_nice = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="per-thread nice is Linux's (setpriority on a thread id)"
)


class Niceness:
    """Completions that record the nice of the thread each job ran on, and its name."""

    def __init__(self, following: list[BatchJob] | None = None) -> None:
        self.reports: queue.SimpleQueue[tuple[str, int]] = queue.SimpleQueue()
        self._following = [] if following is None else following

    def job(self, bulk: bool) -> BatchJob:
        return BatchJob({"x": rows(3)["x"]}, math.inf, False, self._complete, bulk)

    def _complete(
        self, result: RunResult | None, error: BaseException | None, chain: bool
    ) -> BatchJob | None:
        assert error is None and result is not None
        thread = threading.current_thread().name
        self.reports.put((thread, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
        return self._following.pop(0) if self._following else None

    def next(self) -> tuple[str, int]:
        return self.reports.get(timeout=10)


@pytest.fixture
def session() -> ort.InferenceSession:
    return ort.InferenceSession(serialized(failing_model()), providers=["CPUExecutionProvider"])


@needs_thread_nice
def test_bulk_jobs_run_on_threads_of_lower_weight(session: ort.InferenceSession) -> None:
    runner = OrtRunner(session, 2, "lanes")
    base = os.getpriority(os.PRIO_PROCESS, 0)
    done = Niceness()
    try:
        runner.execute(done.job(bulk=True))
        thread, nice = done.next()
        assert "-bulk-" in thread and nice == min(19, max(base, BULK_NICE))
        runner.execute(done.job(bulk=False))
        thread, nice = done.next()
        assert "-bulk-" not in thread and nice == base
    finally:
        runner.close()
    assert os.getpriority(os.PRIO_PROCESS, 0) == base  # the process (this thread) is untouched
    runner.join(10)
    assert not [
        t.name for t in threading.enumerate() if t.name.startswith("ort-lanes-")
    ]  # both lanes stopped


@needs_thread_nice
def test_a_chain_hands_a_job_of_the_other_lane_to_its_workers(session: ort.InferenceSession) -> None:
    runner = OrtRunner(session, 2, "chain")
    base = os.getpriority(os.PRIO_PROCESS, 0)
    following: list[BatchJob] = []
    done = Niceness(following)
    following += [done.job(bulk=True), done.job(bulk=False)]
    try:
        runner.execute(done.job(bulk=False))
        lanes = [done.next() for _ in range(3)]
        assert [("-bulk-" in thread, nice) for thread, nice in lanes] == [
            (False, base),
            (True, min(19, max(base, BULK_NICE))),
            (False, base),
        ]
    finally:
        runner.close()


def test_one_instance_has_one_lane(session: ort.InferenceSession) -> None:
    runner = OrtRunner(session, 1, "one")
    done = Niceness()
    try:
        runner.execute(done.job(bulk=True))
        thread, _ = done.next()
        assert "-bulk-" not in thread
    finally:
        runner.close()
