"""Scheduler behaviour with a fake executor and a fake clock: no sleeps, no real model."""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import Any

import numpy as np
import pytest

from fake_executor import FakeExecutor
from ortserve.core.admission import Admission
from ortserve.core.costmodel import BatchCostModel
from ortserve.core.observer import BatchRecord
from ortserve.core.policy import SchedulingPolicy, queue_wait_target
from ortserve.core.scheduler import Scheduler
from ortserve.errors import (
    DeadlineExceeded,
    DeadlineUnmeetable,
    InferenceError,
    InvalidInput,
    ModelNotReady,
    Overloaded,
)
from ortserve.testing import FakeClock

Feeds = dict[str, np.ndarray]


class Recorder:
    def __init__(self) -> None:
        self.records: list[BatchRecord] = []
        self.rejected: list[Exception] = []

    def on_batch(self, record: BatchRecord) -> None:
        self.records.append(record)

    def on_rejected(self, error: Exception) -> None:
        self.rejected.append(error)


def rows(n: int, start: float = 0.0, width: int = 4) -> Feeds:
    return {"x": (np.arange(n * width, dtype=np.float32).reshape(n, width) + start)}


def make(
    loop: asyncio.AbstractEventLoop, instances: int = 1, cost: BatchCostModel | None = None, **policy: Any
) -> tuple[Scheduler, FakeExecutor, FakeClock, Recorder]:
    executor = FakeExecutor(instances)
    clock = FakeClock()
    recorder = Recorder()
    settings = {"max_batch_size": 8, **policy}
    scheduler = Scheduler(
        executor,
        SchedulingPolicy(**settings),
        clock,
        loop,
        cost,
        recorder,
    )
    return scheduler, executor, clock, recorder


def inline_ready() -> tuple[Scheduler, FakeExecutor, FakeClock, BatchCostModel]:
    """A scheduler whose batches of up to 8 rows (20 us) the executor would run inline."""
    cost = BatchCostModel()
    cost.observe(8, 20e-6)
    scheduler, executor, clock, _ = make(asyncio.get_running_loop(), cost=cost)
    executor.inline_below_s = 100e-6
    return scheduler, executor, clock, cost


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_idle_runner_runs_a_request_at_the_end_of_the_loops_tick() -> None:
    scheduler, executor, _, _ = make(asyncio.get_running_loop())
    future = scheduler.submit(rows(1), 1)
    assert executor.batches == []  # the rest of the loop's tick may still join it
    await settle()
    assert len(executor.batches) == 1
    executor.finish()
    result = await future
    np.testing.assert_array_equal(result[0], rows(1)["x"] * 2)


async def test_a_batch_that_runs_inline_waits_for_the_rest_of_the_loops_tick() -> None:
    # The executor would run a full batch inline (blocking the loop), so an idle scheduler
    # starts it at the end of the tick: requests read in the same tick share it.
    scheduler, executor, _, cost = inline_ready()
    futures = [scheduler.submit(rows(1, 10 * i), 1) for i in range(3)]
    assert executor.batches == []
    await settle()
    assert [batch["x"].shape for batch in executor.batches] == [(3, 4)]
    assert executor.expected[0] == pytest.approx(cost.predict(3))
    executor.finish()
    for i, future in enumerate(futures):
        np.testing.assert_array_equal((await future)[0], rows(1, 10 * i)["x"] * 2)


async def test_a_loop_slow_to_come_back_runs_batches_on_the_runners_thread() -> None:
    # The same cheap batch, but the loop took 30 ms to reach the end of the tick (a flood of
    # intake): run inline, it would wait for the loop again to be settled and to dispatch
    # the next; on the runner's thread the next batch starts when this one ends.
    scheduler, executor, clock, _ = inline_ready()
    first = scheduler.submit(rows(1), 1)
    clock.advance(0.030)
    await settle()
    assert executor.inline == [False]
    executor.finish(seconds=20e-6)
    await first
    second = scheduler.submit(rows(1), 1)  # the loop is prompt again: inline once more
    await settle()
    assert executor.inline == [False, True]
    executor.finish()
    await settle()
    await second


async def test_an_inline_run_keeps_its_instance_until_the_loop_settles_it() -> None:
    # Requests read between an inline run and its settling queue up and go together; an
    # instance freed at once let each of them start a batch of its own (2.3 rows per batch
    # instead of 18.9 for small_mlp at c=64).
    scheduler, executor, _, _ = inline_ready()
    first = scheduler.submit(rows(1), 1)
    await settle()
    assert executor.running[0].inline
    executor.finish()  # the real runner finishes an inline run inside execute()
    assert scheduler.busy_instances == 1
    later = [scheduler.submit(rows(1, 10 * i), 1) for i in range(3)]
    assert len(executor.batches) == 1 and scheduler.queue_depth == 3
    await first
    await settle()
    assert [batch["x"].shape for batch in executor.batches] == [(1, 4), (3, 4)]
    executor.finish()
    for i, future in enumerate(later):
        np.testing.assert_array_equal((await future)[0], rows(1, 10 * i)["x"] * 2)


async def test_a_full_batch_too_long_to_run_inline_starts_at_once_on_a_worker() -> None:
    cost = BatchCostModel()
    cost.observe(8, 500e-6)  # a full batch would block the loop for 0.5 ms
    scheduler, executor, _, _ = make(asyncio.get_running_loop(), cost=cost)
    executor.inline_below_s = 100e-6
    scheduler.submit(rows(8), 8)  # a full batch: nothing can join it, so it starts now
    assert len(executor.batches) == 1 and not executor.running[0].inline


async def test_requests_gather_while_busy_and_each_gets_only_its_rows() -> None:
    scheduler, executor, _, recorder = make(asyncio.get_running_loop())
    first = scheduler.submit(rows(1, 0), 1)
    await settle()
    waiting = [scheduler.submit(rows(n, 100 * n), n) for n in (1, 2, 3)]
    assert len(executor.batches) == 1 and scheduler.queue_depth == 3
    executor.finish()
    await first
    await settle()
    assert len(executor.batches) == 2
    assert executor.batches[1]["x"].shape == (6, 4)
    executor.finish()
    for n, future in zip((1, 2, 3), waiting):
        result = await future
        np.testing.assert_array_equal(result[0], rows(n, 100 * n)["x"] * 2)
    assert [r.requests for r in recorder.records] == [1, 3]
    assert [r.rows for r in recorder.records] == [1, 6]


async def test_batches_never_exceed_max_batch_size() -> None:
    scheduler, executor, _, _ = make(asyncio.get_running_loop(), max_batch_size=4)
    scheduler.submit(rows(1), 1)
    await settle()
    futures = [scheduler.submit(rows(3, i), 3) for i in range(3)]
    executor.finish()
    await settle()
    assert executor.batches[1]["x"].shape[0] == 3  # 3 + 3 would exceed 4
    executor.finish()
    await settle()
    executor.finish()
    await settle()
    executor.finish()
    await asyncio.gather(*futures)
    assert all(b["x"].shape[0] <= 4 for b in executor.batches)


async def test_more_rows_than_max_batch_size_is_invalid() -> None:
    scheduler, _, _, _ = make(asyncio.get_running_loop(), max_batch_size=4)
    with pytest.raises(InvalidInput, match="max_batch_size"):
        scheduler.submit(rows(5), 5)


async def test_full_queue_is_refused_at_once_with_retry_after() -> None:
    scheduler, executor, _, recorder = make(asyncio.get_running_loop(), max_queue_size=2)
    scheduler.submit(rows(1), 1)  # running
    await settle()
    scheduler.submit(rows(1), 1)
    scheduler.submit(rows(1), 1)
    with pytest.raises(Overloaded) as caught:
        scheduler.submit(rows(1), 1)
    assert caught.value.retry_after_s >= 0
    assert isinstance(recorder.rejected[0], Overloaded)
    assert len(executor.batches) == 1


async def test_deadline_passing_in_queue_answers_504_without_running() -> None:
    scheduler, executor, clock, _ = make(asyncio.get_running_loop())
    scheduler.submit(rows(1), 1)
    await settle()
    late = scheduler.submit(rows(1), 1, timeout_s=0.005)
    clock.advance(0.006)
    with pytest.raises(DeadlineExceeded):
        await late
    assert scheduler.queue_depth == 0
    executor.finish()
    await settle()
    assert len(executor.batches) == 1


async def test_default_timeout_applies_when_request_names_none() -> None:
    scheduler, _, clock, _ = make(asyncio.get_running_loop(), default_timeout_s=0.01)
    scheduler.submit(rows(1), 1)
    await settle()
    queued = scheduler.submit(rows(1), 1)
    clock.advance(0.011)
    with pytest.raises(DeadlineExceeded):
        await queued


async def test_urgent_lane_is_served_first() -> None:
    scheduler, executor, _, _ = make(asyncio.get_running_loop(), max_batch_size=1)
    scheduler.submit(rows(1, 0), 1)
    await settle()
    scheduler.submit(rows(1, 10), 1, priority=2)
    scheduler.submit(rows(1, 20), 1, priority=1)
    executor.finish()
    await settle()
    assert executor.batches[1]["x"][0, 0] == 20


async def test_priority_outside_levels_is_invalid() -> None:
    scheduler, _, _, _ = make(asyncio.get_running_loop(), priority_levels=2)
    with pytest.raises(InvalidInput, match="priority"):
        scheduler.submit(rows(1), 1, priority=3)


async def test_free_instance_waits_for_company_up_to_max_queue_delay() -> None:
    scheduler, executor, clock, _ = make(asyncio.get_running_loop(), instances=2, max_queue_delay_s=0.002)
    scheduler.submit(rows(1), 1)  # instance A, runner was idle
    await settle()
    scheduler.submit(rows(1), 1)  # runner busy: wait for company on instance B
    assert len(executor.batches) == 1
    clock.advance(0.001)
    scheduler.submit(rows(1), 1)
    assert len(executor.batches) == 1
    clock.advance(0.0011)
    assert len(executor.batches) == 2
    assert executor.batches[1]["x"].shape[0] == 2


async def test_latency_budget_stops_waiting_before_max_queue_delay() -> None:
    cost = BatchCostModel()
    for n in (1, 8):
        cost.observe(n, 0.001 + 0.0005 * n)  # a = 1 ms, b = 0.5 ms/row
    scheduler, executor, clock, _ = make(
        asyncio.get_running_loop(), instances=2, cost=cost, max_queue_delay_s=0.050, latency_budget_s=0.010
    )
    scheduler.submit(rows(1), 1)
    await settle()
    scheduler.submit(rows(1), 1)
    clock.advance(0.007)
    assert len(executor.batches) == 1
    clock.advance(0.002)  # 10 ms budget - cost(2 rows) = 8 ms
    assert len(executor.batches) == 2


async def test_admission_refuses_what_cannot_meet_its_deadline() -> None:
    cost = BatchCostModel()
    for n in (1, 8):
        cost.observe(n, 0.010 * n)  # 10 ms per row
    # The queue-wait target off: only the deadline decides here.
    scheduler, _, _, recorder = make(asyncio.get_running_loop(), cost=cost, max_queue_wait_s=0.0)
    scheduler.submit(rows(8), 8)  # running: about 80 ms
    scheduler.submit(rows(8), 8)
    with pytest.raises(DeadlineUnmeetable, match="deadline"):  # the client's: 504, not 429
        scheduler.submit(rows(1), 1, timeout_s=0.050)
    assert scheduler.queue_depth == 1
    assert recorder.rejected


async def test_requests_with_different_shapes_are_not_batched_together() -> None:
    scheduler, executor, _, _ = make(asyncio.get_running_loop())
    scheduler.submit(rows(1), 1)
    await settle()
    a = scheduler.submit(rows(1, width=4), 1)
    b = scheduler.submit(rows(1, width=5), 1)
    executor.finish()
    await settle()
    assert executor.batches[1]["x"].shape == (1, 4)
    executor.finish()
    await a
    await settle()
    assert executor.batches[2]["x"].shape == (1, 5)
    executor.finish()
    await b


async def test_failed_batch_fails_its_requests_and_the_next_batch_runs() -> None:
    scheduler, executor, _, recorder = make(asyncio.get_running_loop())
    doomed = scheduler.submit(rows(1), 1)
    await settle()
    after = scheduler.submit(rows(1), 1)
    executor.fail()
    with pytest.raises(InferenceError):
        await doomed
    await settle()
    executor.finish()
    await after
    assert recorder.records[0].failed and not recorder.records[1].failed


async def test_cancelled_request_is_skipped() -> None:
    scheduler, executor, _, _ = make(asyncio.get_running_loop())
    scheduler.submit(rows(1), 1)
    await settle()
    gone = scheduler.submit(rows(1, 50), 1)
    kept = scheduler.submit(rows(1, 60), 1)
    gone.cancel()
    executor.finish()
    await settle()
    assert executor.batches[1]["x"].shape[0] == 1 and executor.batches[1]["x"][0, 0] == 60
    executor.finish()
    await kept


async def test_unbatched_model_runs_requests_one_by_one() -> None:
    scheduler, executor, _, _ = make(asyncio.get_running_loop(), max_batch_size=0)
    scheduler.submit(rows(2), 1)
    await settle()
    scheduler.submit(rows(3), 1)
    executor.finish()
    await settle()
    assert executor.batches[1]["x"].shape[0] == 3


async def test_drain_refuses_new_work_and_waits_for_running() -> None:
    scheduler, executor, _, _ = make(asyncio.get_running_loop())
    running = scheduler.submit(rows(1), 1)
    drained = asyncio.ensure_future(scheduler.drain(5.0))
    await settle()
    with pytest.raises(ModelNotReady):
        scheduler.submit(rows(1), 1)
    assert not drained.done()
    executor.finish()
    await running
    assert await drained


async def test_abort_fails_what_is_still_queued() -> None:
    scheduler, executor, _, _ = make(asyncio.get_running_loop())
    scheduler.submit(rows(1), 1)
    await settle()
    queued = scheduler.submit(rows(1), 1)
    scheduler.abort("unloaded")
    with pytest.raises(ModelNotReady):
        await queued
    assert len(executor.batches) == 1


async def test_drain_waits_for_the_batch_started_after_the_running_one() -> None:
    scheduler, executor, _, _ = make(asyncio.get_running_loop())
    first = scheduler.submit(rows(1), 1)
    await settle()
    second = scheduler.submit(rows(1), 1)
    drained = asyncio.ensure_future(scheduler.drain(5.0))
    await settle()
    executor.finish()  # the queued request is taken and started in the same callback
    await first
    await settle()
    assert not drained.done()
    executor.finish()
    await second
    assert await drained


async def test_a_batch_cancelled_by_shutdown_fails_its_requests() -> None:
    scheduler, executor, _, _ = make(asyncio.get_running_loop())
    pending = scheduler.submit(rows(1), 1)
    await settle()
    executor.cancel()
    with pytest.raises(ModelNotReady):
        await pending


def fitted_cost(per_row_s: float) -> BatchCostModel:
    cost = BatchCostModel()
    for n in (1, 8):
        cost.observe(n, per_row_s * n)
    return cost


def test_the_automatic_queue_wait_target_is_two_full_batches_and_at_least_50_ms() -> None:
    auto = SchedulingPolicy(max_batch_size=8)
    assert queue_wait_target(auto, 0.080) == pytest.approx(0.160)
    assert queue_wait_target(auto, 0.001) == pytest.approx(0.050)
    assert queue_wait_target(SchedulingPolicy(8, max_queue_wait_s=0.2), 0.080) == pytest.approx(0.2)
    assert queue_wait_target(SchedulingPolicy(8, max_queue_wait_s=0.0), 0.080) == math.inf


async def test_admission_refuses_work_beyond_the_queue_wait_target() -> None:
    # 10 ms per row: a full batch of 8 takes 80 ms.
    scheduler, _, _, recorder = make(
        asyncio.get_running_loop(), cost=fitted_cost(0.010), max_queue_wait_s=0.300
    )
    admitted = 0
    with pytest.raises(Overloaded, match="queue-wait target") as caught:
        for _ in range(100):
            scheduler.submit(rows(8), 8)
            admitted += 1
    # One running (80 ms left) and 2 queued batches: a 4th queued one would wait 320 ms.
    assert admitted == 4 and scheduler.queue_depth == 3
    assert caught.value.retry_after_s == pytest.approx(0.320)
    assert recorder.rejected == [caught.value]


async def test_a_zero_queue_wait_target_leaves_only_the_queue_bound() -> None:
    scheduler, _, _, _ = make(
        asyncio.get_running_loop(), cost=fitted_cost(0.010), max_queue_wait_s=0.0, max_queue_size=50
    )
    for _ in range(51):
        scheduler.submit(rows(8), 8)
    with pytest.raises(Overloaded, match="queue full"):
        scheduler.submit(rows(8), 8)


async def test_a_queue_that_stays_late_sheds_what_waited_past_the_target() -> None:
    scheduler, executor, clock, recorder = make(
        asyncio.get_running_loop(), cost=fitted_cost(0.001), max_queue_wait_s=0.010, max_batch_size=1
    )
    scheduler.submit(rows(1), 1)  # runs, and stalls
    await settle()
    late = [scheduler.submit(rows(1, 10 * i), 1) for i in (1, 2, 3)]
    clock.advance(0.015)
    executor.finish()  # the oldest waited 15 ms > 10 ms: late since now, but runs
    assert executor.running[0].feeds["x"][0, 0] == 10
    clock.advance(0.020)
    fresh = scheduler.submit(rows(1, 40), 1)
    clock.advance(0.005)  # late for 25 ms >= 2 x 10 ms: a standing queue
    executor.finish()
    for future in late[1:]:
        with pytest.raises(Overloaded, match="shed"):
            await future
    assert executor.running[0].feeds["x"][0, 0] == 40  # waited 5 ms: runs
    executor.finish()
    await asyncio.gather(late[0], fresh)
    assert len([e for e in recorder.rejected if isinstance(e, Overloaded)]) == 2


async def test_one_long_stall_sheds_nothing() -> None:
    scheduler, executor, clock, _ = make(
        asyncio.get_running_loop(), cost=fitted_cost(0.001), max_queue_wait_s=0.010
    )
    scheduler.submit(rows(1), 1)
    await settle()
    queued = [scheduler.submit(rows(1), 1) for _ in range(3)]
    clock.advance(0.500)  # the machine stalled; the queue then drains at once
    executor.finish()
    executor.finish()
    await asyncio.gather(*queued)


async def test_budget_admission_refuses_at_once_what_would_finish_past_the_budget() -> None:
    scheduler, _, _, _ = make(asyncio.get_running_loop(), cost=fitted_cost(0.002), latency_budget_s=0.040)
    scheduler.submit(rows(8), 8)  # running: 16 ms
    scheduler.submit(rows(8), 8)  # done at about 32 ms: within 40 ms
    with pytest.raises(Overloaded, match="deadline") as refused:
        scheduler.submit(rows(8), 8)  # about 48 ms
    assert not isinstance(refused.value, DeadlineUnmeetable)  # the server's budget: 429
    assert scheduler.queue_depth == 1


async def test_a_request_that_can_no_longer_finish_within_its_budget_leaves_unrun() -> None:
    scheduler, executor, clock, recorder = make(
        asyncio.get_running_loop(), cost=fitted_cost(0.002), latency_budget_s=0.040
    )
    first = scheduler.submit(rows(8), 8)  # runs at once: about 16 ms
    await settle()
    late = scheduler.submit(rows(8), 8)  # predicted done at about 32 ms: admitted
    clock.advance(0.030)  # the first batch ran long: the second could only end at about 46 ms
    executor.finish(seconds=0.030)
    await first
    await settle()
    assert late.done(), "the late request was run instead of being refused"
    with pytest.raises(Overloaded, match="latency budget"):
        late.result()
    assert len(executor.batches) == 1 and scheduler.queue_depth == 0
    assert any("latency budget" in str(error) for error in recorder.rejected)


async def test_a_request_still_within_its_budget_runs_after_a_slow_batch() -> None:
    scheduler, executor, clock, _ = make(
        asyncio.get_running_loop(), cost=fitted_cost(0.002), latency_budget_s=0.040
    )
    first = scheduler.submit(rows(8), 8)
    await settle()
    on_time = scheduler.submit(rows(8), 8)
    clock.advance(0.020)  # 4 ms late: the second still ends by about 36 ms
    executor.finish(seconds=0.020)
    await first
    await settle()
    assert len(executor.batches) == 2
    executor.finish()
    await on_time


async def test_refusal_answers_like_submit_without_queueing() -> None:
    scheduler, _, _, recorder = make(asyncio.get_running_loop(), max_queue_size=1)
    assert scheduler.refusal() is None
    scheduler.submit(rows(1), 1)  # running
    await settle()
    assert scheduler.refusal() is None
    scheduler.submit(rows(1), 1)  # queued: the queue is now full
    refused = scheduler.refusal()
    assert isinstance(refused, Overloaded) and "queue full" in refused.message
    assert isinstance(scheduler.refusal(priority=9), InvalidInput)
    assert scheduler.queue_depth == 1 and recorder.rejected == [refused]
    drained = asyncio.ensure_future(scheduler.drain(0.0))
    await asyncio.sleep(0)
    assert isinstance(scheduler.refusal(), ModelNotReady)
    await drained


async def test_a_kept_refusal_lasts_until_the_queue_changes() -> None:
    scheduler, executor, _, recorder = make(asyncio.get_running_loop(), max_queue_size=1, max_batch_size=1)
    scheduler.submit(rows(1), 1)
    await settle()
    scheduler.submit(rows(1), 1)
    first = scheduler.refusal()
    assert first is not None
    assert scheduler.refusal() is first  # nothing changed: the same verdict, not recomputed
    assert recorder.rejected == [first, first]  # each refusal still counted
    executor.finish()  # the queued request starts: the queue has room again
    await settle()
    assert scheduler.refusal() is None


async def test_a_kept_refusal_lasts_only_as_long_as_time_alone_keeps_it_right() -> None:
    # 10 ms per row, batches of 8 (80 ms): one batch running, three queued. A one-row request
    # would wait 80 + 3 x 80 = 320 ms against a 300 ms target: refused by a 20 ms margin.
    scheduler, _, clock, _ = make(asyncio.get_running_loop(), cost=fitted_cost(0.010), max_queue_wait_s=0.300)
    for _ in range(4):
        scheduler.submit(rows(8), 8)
    first = scheduler.refusal()
    assert isinstance(first, Overloaded) and "queue-wait target" in first.message
    clock.advance(0.015)
    assert scheduler.refusal() is first  # 305 ms of wait now: still right
    clock.advance(0.010)
    assert scheduler.refusal() is None  # 295 ms: admitted, though no count changed


async def test_a_refusal_by_a_margin_no_running_batch_can_shrink_is_kept_however_long() -> None:
    # Nothing runs: a one-row run takes 10 ms against a 1 ms budget, now and at any later time.
    scheduler, executor, clock, _ = make(
        asyncio.get_running_loop(), cost=fitted_cost(0.010), latency_budget_s=0.001
    )
    first = scheduler.refusal()
    assert isinstance(first, Overloaded) and "deadline" in first.message
    clock.advance(5.0)
    assert scheduler.refusal() is first
    assert executor.batches == []


async def test_an_admission_at_the_edge_spares_the_requests_own_submit_the_arithmetic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scheduler, _, _, _ = make(asyncio.get_running_loop(), cost=fitted_cost(0.001), latency_budget_s=0.1)
    computed: list[int] = []
    arithmetic = Admission.refusal_and_slack

    def counted(self: Admission, *args: Any) -> Any:
        computed.append(1)
        return arithmetic(self, *args)

    monkeypatch.setattr(Admission, "refusal_and_slack", counted)
    assert scheduler.refusal() is None and len(computed) == 1
    assert scheduler.refusal() is None and len(computed) == 1  # nothing changed: kept
    scheduler.submit(rows(1), 1)
    assert len(computed) == 1  # the edge's verdict stood for the request it admitted
    scheduler.submit(rows(1), 1)
    assert len(computed) == 2  # the queue changed since: computed again
    scheduler.submit(rows(3), 3)
    assert len(computed) == 3  # more rows than the edge asked about: computed
    assert scheduler.refusal() is None and len(computed) == 4
    scheduler.submit(rows(1), 1, timeout_s=0.5)
    assert len(computed) == 5  # a timeout of its own: computed


async def test_a_kept_admission_goes_when_the_queue_fills() -> None:
    scheduler, _, _, _ = make(asyncio.get_running_loop(), max_queue_size=2, max_batch_size=1)
    assert scheduler.refusal() is None
    scheduler.submit(rows(1), 1)
    await settle()  # running
    assert scheduler.refusal() is None
    scheduler.submit(rows(1), 1)
    scheduler.submit(rows(1), 1)  # the queue holds 2: full
    with pytest.raises(Overloaded, match="queue full"):
        scheduler.submit(rows(1), 1)
    assert isinstance(scheduler.refusal(), Overloaded)


@pytest.mark.parametrize("seed", range(12))
async def test_kept_verdicts_always_agree_with_the_arithmetic_done_afresh(seed: int) -> None:
    """Random submissions, runs and clock steps: whatever refusal() keeps (refused or admitted)
    is what admission computed from scratch would say at that moment, in every lane."""
    rng = np.random.default_rng(seed)
    scheduler, executor, clock, _ = make(
        asyncio.get_running_loop(),
        cost=fitted_cost(0.001),
        max_queue_size=12,
        latency_budget_s=0.040,
        max_queue_wait_s=0.020,
        priority_levels=2,
    )
    for _ in range(300):
        action = rng.integers(5)
        if action == 0:
            with contextlib.suppress(Overloaded):
                scheduler.submit(rows(int(rng.choice([1, 1, 3, 8]))), 1, priority=int(rng.integers(3)))
        elif action == 1 and executor.running:
            executor.finish(seconds=float(rng.uniform(0.0005, 0.012)))
        elif action == 2:
            clock.advance(float(rng.uniform(0.0, 0.006)))
        elif action == 3:
            await settle()
        for priority in (1, 2):
            kept = scheduler.refusal(priority)
            now = clock.now()
            with scheduler._lock:
                fresh = scheduler._admission.refusal(now, 1, priority - 1, None)
            assert (kept is None) == (fresh is None), (kept, fresh)


async def test_a_free_worker_takes_the_next_batch_without_the_loop() -> None:
    scheduler, executor, _, _ = make(asyncio.get_running_loop())
    scheduler.submit(rows(1), 1)
    await settle()
    scheduler.submit(rows(2), 2)
    scheduler.submit(rows(6), 6)  # a full batch (8 rows) is queued: the loop is behind
    executor.finish()  # no loop tick in between: the "worker" gets the next batch at once
    assert len(executor.running) == 1 and executor.running[0].feeds["x"].shape == (8, 4)
    assert scheduler.busy_instances == 1 and scheduler.queue_depth == 0


async def test_a_worker_takes_a_partial_batch_once_its_head_waited_the_batching_delay() -> None:
    scheduler, executor, clock, _ = make(asyncio.get_running_loop(), max_queue_delay_s=0.002)
    scheduler.submit(rows(1), 1)
    await settle()
    scheduler.submit(rows(2), 2)
    clock.advance(0.003)
    executor.finish()
    assert len(executor.running) == 1 and executor.running[0].feeds["x"].shape == (2, 4)


async def test_a_worker_leaves_a_young_partial_batch_to_the_loop() -> None:
    # The loop is reading the requests that would join it: chaining whatever few are queued
    # halved the batches (small_mlp gRPC c=64 on one core: 11 instead of 20 rows).
    scheduler, executor, _, _ = make(asyncio.get_running_loop(), max_queue_delay_s=0.002)
    first = scheduler.submit(rows(1), 1)
    await settle()
    scheduler.submit(rows(2), 2)
    executor.finish()
    assert executor.running == [] and scheduler.busy_instances == 0
    scheduler.submit(rows(3), 3)  # read in the same tick: joins
    await first
    await settle()
    assert [batch["x"].shape for batch in executor.batches] == [(1, 4), (5, 4)]


@pytest.mark.parametrize("seed", range(40))
async def test_no_instance_idles_while_requests_wait_under_any_interleaving(seed: int) -> None:
    # Random interleavings of submissions (some with deadlines), completions, failures,
    # cancellations and time passing. After each step has settled, a queued request means
    # every instance is busy or a free one is deliberately waiting for company (its timer
    # armed). At the end every request has an answer.
    rng = np.random.default_rng(seed)
    instances = int(rng.integers(1, 4))
    scheduler, executor, clock, _ = make(
        asyncio.get_running_loop(),
        instances=instances,
        max_batch_size=int(rng.choice([0, 1, 4])),
        max_queue_delay_s=0.002,
        max_queue_size=12,
    )
    futures: list[asyncio.Future[list[np.ndarray]]] = []
    for _ in range(60):
        op = rng.integers(0, 6)
        if op <= 1:
            timeout = None if rng.random() < 0.7 else float(rng.uniform(0.001, 0.01))
            with contextlib.suppress(Overloaded):
                futures.append(scheduler.submit(rows(1), 1, timeout_s=timeout))
        elif op == 2 and executor.running:
            executor.finish(int(rng.integers(0, len(executor.running))))
        elif op == 3 and executor.running:
            executor.fail(int(rng.integers(0, len(executor.running))))
        elif op == 4 and futures:
            futures[int(rng.integers(0, len(futures)))].cancel()
        else:
            clock.advance(float(rng.uniform(0.0, 0.004)))
        await settle()
        if scheduler.queue_depth:
            assert scheduler.busy_instances == instances or scheduler.waiting_for_company
        assert len(executor.running) == scheduler.busy_instances <= instances
    while executor.running or scheduler.queue_depth:
        if executor.running:
            executor.finish()
        else:
            clock.advance(0.01)
        await settle()
    assert all(f.done() for f in futures)
    for future in futures:  # retrieve the failures so that none is reported as unobserved
        if not future.cancelled():
            future.exception()
