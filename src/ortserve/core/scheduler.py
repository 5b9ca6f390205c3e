"""Per-version request queue: priority lanes, deadlines, admission control and batching.

The scheduler is driven by events, not by a polling task: a submission, a finished batch and
a delay timer each call ``_dispatch``, which starts batches while an instance is free. A
batch runs in the executor's threads (``session.run`` releases the GIL) and its completion
callback splits the outputs back to each request as views.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import numpy as np
import numpy.typing as npt

from ortserve.core.clock import Clock, TimerHandle
from ortserve.core.costmodel import BatchCostModel
from ortserve.core.observer import BatchRecord, NullObserver, SchedulerObserver
from ortserve.core.policy import SchedulingPolicy
from ortserve.errors import (
    DeadlineExceeded,
    InferenceError,
    InvalidInput,
    ModelNotReady,
    OrtServeError,
    Overloaded,
)

__all__ = ["BatchExecutor", "Scheduler"]

logger = logging.getLogger(__name__)

Array = npt.NDArray[np.generic]
Feeds = dict[str, Array]


class BatchExecutor(Protocol):
    """Runs one assembled batch; called from the scheduler's loop, runs in a worker thread."""

    @property
    def instances(self) -> int: ...

    inline_below_s: float
    """Batches expected to be shorter than this run inline in ``execute`` (0: never)."""

    def execute(self, feeds: Feeds, expected_s: float) -> asyncio.Future[tuple[list[Array], float]]:
        """Start a run expected to take ``expected_s`` (inf when unknown); the future gives
        the outputs and the seconds the run took."""
        ...


@dataclass(slots=True, eq=False)
class _Pending:
    feeds: Feeds
    rows: int
    signature: tuple[tuple[int, ...], ...]
    arrival: float
    deadline: float | None
    future: asyncio.Future[list[Array]]
    lane: int
    timer: TimerHandle | None = None
    live: bool = True


@dataclass(slots=True, eq=False)
class _Lane:
    queue: deque[_Pending] = field(default_factory=deque)
    rows: int = 0


class Scheduler:
    """Admits, queues, batches and runs the requests of one served version.

    Args:
        executor: runs batches (one or more instances).
        policy: queueing rules.
        clock: time source and timers; tests pass a fake one.
        loop: the event loop whose futures the requests await.
        cost_model: batch cost estimate, shared with warm-up so it starts fitted.
        observer: receives batch records (metrics, statistics).
    """

    def __init__(
        self,
        executor: BatchExecutor,
        policy: SchedulingPolicy,
        clock: Clock,
        loop: asyncio.AbstractEventLoop,
        cost_model: BatchCostModel | None = None,
        observer: SchedulerObserver | None = None,
    ) -> None:
        self._executor = executor
        self._policy = policy
        self._clock = clock
        self._loop = loop
        self.cost_model = cost_model or BatchCostModel()
        self.observer: SchedulerObserver = observer or NullObserver()
        self._lanes = [_Lane() for _ in range(policy.priority_levels)]
        self._queued_requests = 0
        self._queued_rows = 0
        self._busy = 0
        self._busy_until: list[float] = []
        self._delay_timer: TimerHandle | None = None
        self._delay_at = math.inf
        self._closing = False
        self._dispatch_soon: asyncio.Handle | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def queue_depth(self) -> int:
        """Requests waiting, not yet running."""
        return self._queued_requests

    @property
    def busy_instances(self) -> int:
        """Batches running now."""
        return self._busy

    def submit(
        self, feeds: Feeds, rows: int, priority: int = 0, timeout_s: float | None = None
    ) -> asyncio.Future[list[Array]]:
        """Admit a validated request; the future resolves to its own rows of every output.

        Args:
            feeds: input name -> array; dim 0 is the batch dimension when batching is on.
            rows: the request's size along dim 0 (1 when batching is off).
            priority: 0 for the default lane, else 1 (most urgent) .. priority_levels.
            timeout_s: time allowed from now; None uses the policy's default.

        Raises:
            ModelNotReady: the scheduler is draining.
            InvalidInput: priority out of range, or more rows than max_batch_size.
            Overloaded: queue full, or the deadline cannot be met given the queue ahead.
        """
        policy = self._policy
        if self._closing:
            raise ModelNotReady("model is shutting down")
        lane = self._lane_index(priority)
        if policy.max_batch_size and rows > policy.max_batch_size:
            raise InvalidInput(
                f"request has {rows} rows, more than the model's max_batch_size {policy.max_batch_size}"
            )
        now = self._clock.now()
        if timeout_s is None:
            timeout_s = policy.default_timeout_s
        deadline = None if timeout_s is None else now + timeout_s
        self._admit(now, rows, lane, deadline)
        future: asyncio.Future[list[Array]] = self._loop.create_future()
        signature = tuple(a.shape[1:] for a in feeds.values()) if policy.max_batch_size else ()
        pending = _Pending(feeds, rows, signature, now, deadline, future, lane)
        if deadline is not None:
            pending.timer = self._clock.call_at(deadline, partial(self._expire, pending))
        self._lanes[lane].queue.append(pending)
        self._lanes[lane].rows += rows
        self._queued_requests += 1
        self._queued_rows += rows
        self._idle.clear()
        if self._busy == 0 and self._runs_inline():
            # The run will block the loop: let the rest of this tick's requests join it first.
            if self._dispatch_soon is None:
                self._dispatch_soon = self._loop.call_soon(self._dispatch_at_tick_end)
        else:
            self._dispatch()
        return future

    def _runs_inline(self) -> bool:
        """Whether a full batch is expected to run inline, on the loop's thread."""
        model = self.cost_model
        return (
            model.fitted and model.predict(self._policy.max_batch_size or 1) < self._executor.inline_below_s
        )

    def _dispatch_at_tick_end(self) -> None:
        self._dispatch_soon = None
        self._dispatch()

    def _lane_index(self, priority: int) -> int:
        levels = self._policy.priority_levels
        if priority == 0:
            return self._policy.default_priority - 1
        if not 1 <= priority <= levels:
            raise InvalidInput(f"priority {priority} is outside 0..{levels} for this model")
        return priority - 1

    def _admit(self, now: float, rows: int, lane: int, deadline: float | None) -> None:
        policy = self._policy
        if self._queued_requests >= policy.max_queue_size:
            error = Overloaded(
                f"queue full ({policy.max_queue_size} requests waiting)",
                retry_after_s=self._drain_estimate(now, self._queued_rows),
            )
            self.observer.on_rejected(error)
            raise error
        limit = deadline
        if policy.latency_budget_s is not None:
            budget_end = now + policy.latency_budget_s
            limit = budget_end if limit is None else min(limit, budget_end)
        if limit is None or not self.cost_model.fitted:
            return
        ahead = sum(self._lanes[i].rows for i in range(lane + 1))
        finish = self._drain_estimate(now, ahead + rows, absolute=True)
        if finish > limit:
            error = Overloaded(
                f"cannot finish within the deadline: about {(finish - now) * 1e3:.1f} ms of work "
                "is queued ahead",
                retry_after_s=finish - now,
            )
            self.observer.on_rejected(error)
            raise error

    def _drain_estimate(self, now: float, rows: int, absolute: bool = False) -> float:
        """When ``rows`` queued rows would be done, given the batches running now."""
        instances = self._executor.instances
        free_at = now if self._busy < instances else max(now, min(self._busy_until, default=now))
        per_batch = self._policy.max_batch_size or 1
        batches = math.ceil(rows / per_batch) if rows else 0
        full_cost = self.cost_model.predict(min(per_batch, max(rows, 1)))
        work = batches * full_cost / instances
        finish = free_at + work
        return finish if absolute else max(0.0, finish - now)

    def _expire(self, pending: _Pending, settle: bool = True) -> None:
        if not pending.live:
            return
        self._remove(pending)
        if not pending.future.done():
            error = DeadlineExceeded("deadline passed while the request was queued")
            self.observer.on_rejected(error)
            pending.future.set_exception(error)
        if settle:
            self._check_idle()

    def _remove(self, pending: _Pending) -> None:
        pending.live = False
        self._queued_requests -= 1
        self._queued_rows -= pending.rows
        self._lanes[pending.lane].rows -= pending.rows
        if pending.timer is not None:
            pending.timer.cancel()
            pending.timer = None

    def _check_idle(self) -> None:
        # Called only where the state is settled (never between taking a batch and starting
        # it), so a drain can never see a passing "idle" while work is being handed over.
        if self._queued_requests == 0 and self._busy == 0:
            self._idle.set()

    def _head(self) -> _Pending | None:
        for lane in self._lanes:
            queue = lane.queue
            while queue:
                head = queue[0]
                if head.live and not head.future.done():
                    return head
                queue.popleft()
                if head.live:  # cancelled by its client while queued
                    self._remove(head)
                    self._check_idle()
        return None

    def _dispatch(self, timer_fired: bool = False) -> None:
        instances = self._executor.instances
        while self._busy < instances:
            head = self._head()
            if head is None:
                return
            now = self._clock.now()
            wait_until = self._wait_until(head, now)
            # A fired delay timer means the wait is over, even when the loop's millisecond
            # timer resolution woke us a fraction early: re-arming would only spin.
            if wait_until > now and not timer_fired:
                self._arm_delay(wait_until)
                return
            timer_fired = False
            batch = self._take_batch(head)
            if batch:
                self._start(batch, now)

    def _wait_until(self, head: _Pending, now: float) -> float:
        """When to stop waiting for company; ``now`` or earlier means go at once."""
        policy = self._policy
        if not policy.max_batch_size or self._busy == 0:
            return now  # no batching, or the runner is idle: run at once
        rows = self._queued_rows
        if rows >= policy.max_batch_size:
            return now
        preferred = policy.preferred_batch_sizes
        if preferred and (rows in preferred or rows >= max(preferred)):
            return now
        until = head.arrival + policy.max_queue_delay_s
        if policy.latency_budget_s is not None and self.cost_model.fitted:
            latest_start = head.arrival + policy.latency_budget_s - self.cost_model.predict(rows + 1)
            until = min(until, latest_start)
        return until

    def _arm_delay(self, when: float) -> None:
        if self._delay_timer is not None and self._delay_at <= when:
            return
        if self._delay_timer is not None:
            self._delay_timer.cancel()
        self._delay_at = when
        self._delay_timer = self._clock.call_at(when, self._on_delay)

    def _on_delay(self) -> None:
        self._delay_timer = None
        self._delay_at = math.inf
        self._dispatch(timer_fired=True)

    def _take_batch(self, head: _Pending) -> list[_Pending]:
        """The head request and the queued requests that fit beside it, in lane order."""
        max_rows = self._policy.max_batch_size
        batch: list[_Pending] = []
        rows = 0
        now = self._clock.now()
        for lane in self._lanes:
            queue = lane.queue
            skipped: list[_Pending] = []
            while queue and (not batch or (max_rows and rows < max_rows)):
                pending = queue.popleft()
                if not pending.live:
                    continue
                if pending.future.done():
                    self._remove(pending)
                    continue
                if pending.deadline is not None and pending.deadline <= now:
                    self._expire(pending, settle=False)
                    continue
                fits = not batch or (pending.signature == head.signature and rows + pending.rows <= max_rows)
                if not fits:
                    skipped.append(pending)
                    if len(skipped) > 64:
                        break
                    continue
                self._remove(pending)
                batch.append(pending)
                rows += pending.rows
            queue.extendleft(reversed(skipped))
            if batch and (not max_rows or rows >= max_rows):
                break
        if batch:
            self._idle.clear()
        return batch

    def _start(self, batch: list[_Pending], now: float) -> None:
        started = self._clock.now()
        if len(batch) == 1:
            feeds = batch[0].feeds
        else:
            names = batch[0].feeds.keys()
            feeds = {name: np.concatenate([p.feeds[name] for p in batch]) for name in names}
        assembled = self._clock.now()
        rows = sum(p.rows for p in batch)
        predicted = self.cost_model.predict(rows)
        expected_end = assembled + predicted
        self._busy += 1
        self._busy_until.append(expected_end)
        try:
            run = self._executor.execute(feeds, predicted if self.cost_model.fitted else math.inf)
        except Exception as exc:  # the executor could not even start: fail this batch only
            self._busy -= 1
            self._busy_until.remove(expected_end)
            self._fail(batch, exc)
            return
        waits = tuple(started - p.arrival for p in batch)
        run.add_done_callback(partial(self._finish, batch, rows, expected_end, waits, assembled - started))

    def _finish(
        self,
        batch: list[_Pending],
        rows: int,
        expected_end: float,
        waits: tuple[float, ...],
        assemble_s: float,
        run: asyncio.Future[tuple[list[Array], float]],
    ) -> None:
        self._busy -= 1
        self._busy_until.remove(expected_end)
        failed = False
        split_s = 0.0
        run_s = 0.0
        if run.cancelled():  # the executor was shut down under it
            failed = True
            self._fail(batch, ModelNotReady("the model was unloaded while this batch waited to run"))
            outputs = None
        else:
            try:
                outputs, run_s = run.result()
            except Exception as exc:
                failed = True
                self._fail(batch, exc)
                outputs = None
        if outputs is not None:
            self.cost_model.observe(rows, run_s)
            split_start = self._clock.now()
            self._deliver(batch, outputs)
            split_s = self._clock.now() - split_start
        self.observer.on_batch(BatchRecord(len(batch), rows, waits, assemble_s, run_s, split_s, failed))
        self._dispatch()
        self._check_idle()

    def _deliver(self, batch: Sequence[_Pending], outputs: list[Array]) -> None:
        if len(batch) == 1:
            future = batch[0].future
            if not future.done():
                future.set_result(outputs)
            return
        start = 0
        for pending in batch:
            end = start + pending.rows
            if not pending.future.done():
                pending.future.set_result([out[start:end] for out in outputs])
            start = end

    def _fail(self, batch: Sequence[_Pending], exc: BaseException) -> None:
        if isinstance(exc, OrtServeError):
            error: OrtServeError = exc
        else:
            logger.error("batch of %d requests failed", len(batch), exc_info=exc)
            error = InferenceError("the model failed to run this batch (see server log)")
        for pending in batch:
            if not pending.future.done():
                pending.future.set_exception(error)

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new work and wait for queued and running requests; True if all finished."""
        self._closing = True
        try:
            async with asyncio.timeout(timeout_s):
                while self._queued_requests or self._busy:
                    self._idle.clear()
                    await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def abort(self, reason: str) -> None:
        """Fail every queued request (after a drain ran out of time)."""
        self._closing = True
        if self._delay_timer is not None:
            self._delay_timer.cancel()
            self._delay_timer = None
        for lane in self._lanes:
            while lane.queue:
                pending = lane.queue.popleft()
                if pending.live:
                    self._remove(pending)
                    if not pending.future.done():
                        pending.future.set_exception(ModelNotReady(reason))
        self._check_idle()
