"""Per-version request queue: priority lanes, deadlines, admission control and batching.

The scheduler is driven by events, not by a polling task: a submission and a delay timer
call ``_dispatch`` on the event loop, and a worker that finishes a batch takes the next one
itself (:meth:`BatchJob.complete`), so the model never waits for a loop that is busy reading
sockets. The queue is shared between the loop and the workers under one lock; whatever must
happen on the loop (answering futures, timers, the observer) is handed back to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import numpy.typing as npt

from ortserve.core.adaptive import AdaptiveLimit
from ortserve.core.clock import Clock, TimerHandle
from ortserve.core.costmodel import BatchCostModel
from ortserve.core.inlining import InlineGate
from ortserve.core.job import BatchExecutor, BatchJob, Feeds, RunResult
from ortserve.core.observer import BatchRecord, NullObserver, SchedulerObserver
from ortserve.core.policy import SchedulingPolicy, StandingQueue, queue_wait_target
from ortserve.core.screening import BatchScreen, split_refused
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

# A loop that takes longer than this to come back to a callback is busy with other work
# (intake under overload): a batch run inline would wait for its turns on it (the dispatch,
# the settle), so batches go to the runner's thread, which takes the next one itself.
_LOOP_BEHIND_S = 0.010

Array = npt.NDArray[np.generic]


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


@dataclass(frozen=True, slots=True)
class _KeptRefusal:
    """A refusal answered at ``changes`` (the scheduler's change count), right until ``until``."""

    error: Overloaded
    changes: int
    until: float


@dataclass(slots=True, eq=False)
class _Run:
    batch: list[_Pending]
    rows: int
    expected_end: float
    waits: tuple[float, ...]
    assemble_s: float = 0.0
    refused: Sequence[tuple[_Pending, InvalidInput]] = ()
    """Requests the screen took out of the batch: answered with their error when it settles."""


class Scheduler:
    """Admits, queues, batches and runs the requests of one served version.

    Args:
        executor: runs batches (one or more instances).
        policy: queueing rules.
        clock: time source and timers; tests pass a fake one.
        loop: the event loop whose futures the requests await.
        cost_model: batch cost estimate, shared with warm-up so it starts fitted.
        observer: receives batch records (metrics, statistics).
        screen: the input sandbox's value limits, checked once per assembled batch (see
            :meth:`_job`); None: no check.
    """

    def __init__(
        self,
        executor: BatchExecutor,
        policy: SchedulingPolicy,
        clock: Clock,
        loop: asyncio.AbstractEventLoop,
        cost_model: BatchCostModel | None = None,
        observer: SchedulerObserver | None = None,
        screen: BatchScreen | None = None,
    ) -> None:
        self._executor = executor
        self._screen = screen
        self._policy = policy
        self._clock = clock
        self._loop = loop
        self.cost_model = cost_model or BatchCostModel()
        self.observer: SchedulerObserver = observer or NullObserver()
        self._inline = InlineGate()  # guarded by _lock, like the queue
        # Guarded by _lock (the loop and the workers both take batches):
        self._lock = threading.Lock()
        self._lanes = [_Lane() for _ in range(policy.priority_levels)]
        self._queued_requests = 0
        self._queued_rows = 0
        self._busy = 0
        self._busy_until: list[float] = []
        self._dropped: list[tuple[_Pending, OrtServeError]] = []  # answered on the loop
        self._stale_timers: list[TimerHandle] = []  # cancelled on the loop
        self._standing = StandingQueue()
        self._running_requests = 0
        self.concurrency = _concurrency_limit(policy, executor.instances)
        # Bumped by every change admission reads (queue, running batches, cost model), so a
        # kept refusal knows when it may have gone stale; read without the lock (an int).
        self._changes = 0
        self._kept: list[_KeptRefusal | None] = [None] * policy.priority_levels
        # Per lane, the change count at which a one-row request with the default timeout was
        # last admitted: with the counts unchanged it is still admitted (see _still_admitted).
        self._admitted = [-1] * policy.priority_levels
        # Loop thread only:
        self._delay_timer: TimerHandle | None = None
        self._delay_at = math.inf
        self._closing = False
        self._dispatch_soon: asyncio.Handle | None = None
        self._soon_at = 0.0
        self._loop_lag_s = 0.0  # how late the last end-of-tick dispatch ran
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

    @property
    def waiting_for_company(self) -> bool:
        """A free instance is holding the queue back on purpose (batching delay timer)."""
        return self._delay_timer is not None

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
            Overloaded: queue full, or the deadline, budget or queue-wait target cannot be
                met given the queue ahead.
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
        # What refusal() asks about: one row, the default timeout.
        as_at_edge = rows == 1 and timeout_s is None
        if timeout_s is None:
            timeout_s = policy.default_timeout_s
        deadline = None if timeout_s is None else now + timeout_s
        future: asyncio.Future[list[Array]] = self._loop.create_future()
        signature = tuple(a.shape[1:] for a in feeds.values()) if policy.max_batch_size else ()
        pending = _Pending(feeds, rows, signature, now, deadline, future, lane)
        with self._lock:
            if as_at_edge and self._still_admitted(lane):
                error = None  # the edge's verdict for this request (refusal()) still holds
            else:
                error = self._refusal(now, rows, lane, deadline)
            if error is None:
                self._enqueue(pending)
        if error is not None:
            self.observer.on_rejected(error)
            raise error
        if deadline is not None:
            pending.timer = self._clock.call_at(deadline, partial(self._expire, pending))
        self._idle.clear()
        if self._busy == 0 and not self._full_batch_queued():
            # Nothing runs: let the rest of this tick's requests join this one first. Starting
            # at once made one-row batches whenever the model had just gone idle under load.
            self._dispatch_at_tick_end_once()
        else:
            self._dispatch()
        return future

    def refusal(self, priority: int = 0) -> OrtServeError | None:
        """The refusal a one-row request would get now, or None; nothing is queued.

        The transports ask this with only the path and headers read, so that a request that
        will be refused costs no body decoding (issue 10: shed load at the edge). Under
        overload nearly every request asks, and the answer rarely changes between two changes
        of the queue: a refusal is kept, per lane, until the queue or the running batches
        change or until time alone could make it wrong, so refusing costs a lookup. The
        returned error may be shared by many requests: callers answer with it, never raise it
        (raising one instance again and again would chain its tracebacks).

        Returns:
            ModelNotReady (draining), InvalidInput (priority out of range), Overloaded (the
            queue, the concurrency limit, the queue-wait target or the budget refuses it).
        """
        if self._closing:
            return ModelNotReady("model is shutting down")
        try:
            lane = self._lane_index(priority)
        except InvalidInput as invalid:
            return invalid
        if self._still_admitted(lane):
            return None
        now = self._clock.now()
        kept = self._kept[lane]
        if kept is not None and kept.changes == self._changes and now < kept.until:
            error: Overloaded | None = kept.error
        else:
            timeout_s = self._policy.default_timeout_s
            with self._lock:
                error, slack_s = self._refusal_and_slack(
                    now, 1, lane, None if timeout_s is None else now + timeout_s
                )
                if error is None:
                    self._admitted[lane] = self._changes
                    self._kept[lane] = None
                else:
                    self._kept[lane] = _KeptRefusal(error, self._changes, now + slack_s)
        if error is not None:
            self.observer.on_rejected(error)
        return error

    def _still_admitted(self, lane: int) -> bool:
        """Whether a one-row request with the default timeout admitted to ``lane`` at the
        current change count would still be admitted now.

        With the counts unchanged, time only relaxes admission: a wait ahead shrinks while the
        running batches near their end and stays put once they are due, and a finish past the
        deadline or budget gets no closer to it (both move with the clock once nothing is
        running). So the edge's verdict (:meth:`refusal`) stands for the request's own
        :meth:`submit` that follows in the same tick, which then skips the arithmetic; any
        change to the queue, the running batches or the cost model bumps the count.
        """
        return self._admitted[lane] == self._changes

    def _enqueue(self, pending: _Pending) -> None:
        self._changes += 1
        lane = self._lanes[pending.lane]
        lane.queue.append(pending)
        lane.rows += pending.rows
        self._queued_requests += 1
        self._queued_rows += pending.rows

    def _full_batch_queued(self) -> bool:
        """Whether waiting for more company cannot make the next batch larger."""
        return self._queued_rows >= (self._policy.max_batch_size or 1)

    def _dispatch_at_tick_end_once(self) -> None:
        if self._dispatch_soon is None:
            self._soon_at = self._clock.now()
            self._dispatch_soon = self._loop.call_soon(self._dispatch_at_tick_end)

    def _dispatch_at_tick_end(self) -> None:
        self._dispatch_soon = None
        self._loop_lag_s = self._clock.now() - self._soon_at
        self._dispatch()

    def _lane_index(self, priority: int) -> int:
        levels = self._policy.priority_levels
        if priority == 0:
            return self._policy.default_priority - 1
        if not 1 <= priority <= levels:
            raise InvalidInput(f"priority {priority} is outside 0..{levels} for this model")
        return priority - 1

    # -- admission (under the lock) -----------------------------------------------------
    def _refusal(self, now: float, rows: int, lane: int, deadline: float | None) -> Overloaded | None:
        return self._refusal_and_slack(now, rows, lane, deadline)[0]

    def _refusal_and_slack(
        self, now: float, rows: int, lane: int, deadline: float | None
    ) -> tuple[Overloaded | None, float]:
        """The refusal, and how long it stays right if the queue does not change.

        A refusal by a count (queue bound, concurrency limit) stays right until the counts
        change. One by a margin of time (the wait over the target, the finish past the
        deadline or budget, which move with the clock) shrinks only while the instances are
        all busy and the running batches get closer to done, by the time passed: right for
        ``margin`` seconds, or until the counts change if the margin outlasts the busy time.
        """
        policy = self._policy
        if self._queued_requests >= policy.max_queue_size:
            full = Overloaded(
                f"queue full ({policy.max_queue_size} requests waiting)",
                retry_after_s=self._drain_estimate(now, self._queued_rows),
            )
            return full, math.inf
        concurrency = self.concurrency
        if concurrency is not None and self._queued_requests + self._running_requests >= concurrency.limit:
            held = Overloaded(
                f"concurrency limit reached ({concurrency.limit} requests held)",
                retry_after_s=self._drain_estimate(now, self._queued_rows),
            )
            return held, math.inf
        if not self.cost_model.fitted:
            return None, 0.0
        ahead = sum(self._lanes[i].rows for i in range(lane + 1))
        wait = self._drain_estimate(now, ahead)
        target = queue_wait_target(policy, self._full_batch_s())
        if wait > target:
            late = Overloaded(
                f"about {wait * 1e3:.1f} ms of work is queued ahead, more than the "
                f"{target * 1e3:.1f} ms queue-wait target",
                retry_after_s=wait,
            )
            return late, _slack(wait - target, self._busy_for(now))
        limit = deadline
        if policy.latency_budget_s is not None:
            budget_end = now + policy.latency_budget_s
            limit = budget_end if limit is None else min(limit, budget_end)
        if limit is None:
            return None, 0.0
        finish = self._drain_estimate(now, ahead + rows, absolute=True)
        if finish > limit:
            missed = Overloaded(
                f"cannot finish within the deadline: about {(finish - now) * 1e3:.1f} ms of work "
                "is queued ahead",
                retry_after_s=finish - now,
            )
            return missed, _slack(finish - limit, self._busy_for(now))
        return None, 0.0

    def _full_batch_s(self) -> float:
        return self.cost_model.predict(self._policy.max_batch_size or 1)

    def _busy_for(self, now: float) -> float:
        """How long until an instance is free, by the running batches' predicted ends."""
        if self._busy < self._executor.instances:
            return 0.0
        return max(0.0, min(self._busy_until, default=now) - now)

    def _drain_estimate(self, now: float, rows: int, absolute: bool = False) -> float:
        """When ``rows`` queued rows would be done, given the batches running now."""
        instances = self._executor.instances
        free_at = now + self._busy_for(now)
        per_batch = self._policy.max_batch_size or 1
        batches = math.ceil(rows / per_batch) if rows else 0
        full_cost = self.cost_model.predict(min(per_batch, max(rows, 1)))
        work = batches * full_cost / instances
        finish = free_at + work
        return finish if absolute else max(0.0, finish - now)

    # -- leaving the queue --------------------------------------------------------------
    def _expire(self, pending: _Pending) -> None:
        with self._lock:
            if not pending.live:
                return
            self._remove(pending)
        if not pending.future.done():
            error = DeadlineExceeded("deadline passed while the request was queued")
            self.observer.on_rejected(error)
            pending.future.set_exception(error)
        self._after_loop_work()

    def _remove(self, pending: _Pending) -> None:
        """Take a request off the books (under the lock); its timer is cancelled on the loop."""
        pending.live = False
        self._changes += 1
        self._queued_requests -= 1
        self._queued_rows -= pending.rows
        self._lanes[pending.lane].rows -= pending.rows
        if pending.timer is not None:
            self._stale_timers.append(pending.timer)
            pending.timer = None

    def _after_loop_work(self) -> None:
        """On the loop: answer what workers dropped, cancel stale timers, note idleness."""
        with self._lock:
            dropped, self._dropped = self._dropped, []
            timers, self._stale_timers = self._stale_timers, []
        for timer in timers:
            timer.cancel()
        for pending, error in dropped:
            if not pending.future.done():
                self.observer.on_rejected(error)
                pending.future.set_exception(error)
        # Only where the state is settled, so a drain never sees a passing "idle" while a
        # batch is being handed over.
        if self._queued_requests == 0 and self._busy == 0:
            self._idle.set()

    # -- taking batches (under the lock) ------------------------------------------------
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
        return None

    def _take_ready(self, now: float, timer_fired: bool) -> tuple[list[_Pending], float]:
        """A batch to start now and the instance marked busy, or ``([], when to look again)``
        (inf: nothing queued)."""
        while self._busy < self._executor.instances:
            head = self._head()
            if head is None:
                return [], math.inf
            wait_until = self._wait_until(head, now)
            # A fired delay timer means the wait is over, even when the loop's millisecond
            # timer resolution woke us a fraction early: re-arming would only spin.
            if wait_until > now and not timer_fired:
                return [], wait_until
            batch = self._take_batch(head, now)
            if batch:
                self._busy += 1
                return batch, now
        return [], math.inf

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

    def _take_batch(self, head: _Pending, now: float) -> list[_Pending]:
        """The head request and the queued requests that fit beside it, in lane order.

        Requests whose deadline passed leave without running, and so do those that waited
        past the queue-wait target while the queue stands late (CoDel: running them only
        makes everyone behind them late too).
        """
        max_rows = self._policy.max_batch_size
        target = queue_wait_target(self._policy, self._full_batch_s())
        shedding = self.cost_model.fitted and self._standing.shedding(now - head.arrival, target, now)
        shed_before = now - target if shedding else -math.inf
        late_before = self._late_before(now)
        batch: list[_Pending] = []
        rows = 0
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
                    self._drop(pending, DeadlineExceeded("deadline passed while the request was queued"))
                    continue
                if pending.arrival < shed_before:
                    self._drop(pending, Overloaded("shed: waited too long in an overloaded queue", 0.0))
                    continue
                if pending.arrival < late_before:
                    self._drop(
                        pending, Overloaded("shed: it could no longer finish within the latency budget", 0.0)
                    )
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
        return batch

    def _late_before(self, now: float) -> float:
        """Requests that arrived before this would finish past the latency budget if the
        batch being formed ran now (under the lock; -inf without a budget).

        Admission predicts the finish from the queue it sees; when batches then run longer
        than predicted (the machine slowed, the loop took the core) a request admitted within
        the budget could still be answered after it. Such a request leaves unrun with a 429
        instead: an answer past the budget is worth less to its client than a prompt refusal,
        and running it would make the requests behind it late too.
        """
        budget = self._policy.latency_budget_s
        if budget is None or not self.cost_model.fitted:
            return -math.inf
        rows = min(self._policy.max_batch_size or 1, max(1, self._queued_rows))
        return now + self.cost_model.predict(rows) - budget

    def _drop(self, pending: _Pending, error: OrtServeError) -> None:
        self._remove(pending)
        self._dropped.append((pending, error))

    def _begin(self, batch: list[_Pending], now: float) -> tuple[_Run, float]:
        """Book the batch as running (under the lock); returns it and its predicted time."""
        self._changes += 1
        rows = sum(p.rows for p in batch)
        predicted = self.cost_model.predict(rows)
        run = _Run(batch, rows, now + predicted, tuple(now - p.arrival for p in batch))
        self._busy_until.append(run.expected_end)
        self._running_requests += len(batch)
        return run, predicted if self.cost_model.fitted else math.inf

    def _job(self, run: _Run, expected_s: float, inline: bool) -> BatchJob | None:
        """Assemble the batch (outside the lock: concatenation takes a while) and screen it.

        The screen checks the assembled batch once: its NumPy calls cost the same for one row
        as for 32, so a check per request cost a small model more than its share of the run.
        A batch it cannot prove fine loses the requests that break a limit (answered 400 when
        the run settles) and runs with the others; a batch that loses all is settled unrun
        (None: nothing to execute).
        """
        started = self._clock.now()
        feeds = _assemble(run.batch)
        if self._screen is not None and not self._screen.passes(feeds):
            if not self._screen_out(run, self._screen):
                with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
                    self._loop.call_soon_threadsafe(partial(self._settle, run, None, None, True))
                return None
            feeds = _assemble(run.batch)
        run.assemble_s = self._clock.now() - started
        return BatchJob(feeds, expected_s, inline, partial(self._complete, run))

    def _screen_out(self, run: _Run, screen: BatchScreen) -> bool:
        """Move the requests the screen refuses to ``run.refused``; False when none is left."""
        served, refused = split_refused(screen, run.batch)
        if refused:
            wait_of = dict(zip(map(id, run.batch), run.waits, strict=True))
            run.batch, run.refused = served, refused
            run.rows = sum(p.rows for p in served)
            run.waits = tuple(wait_of[id(p)] for p in served)
            with self._lock:
                self._changes += 1  # a kept admission verdict counted these requests
                self._running_requests -= len(refused)
        return bool(served)

    # -- dispatch on the loop -----------------------------------------------------------
    def _dispatch(self, timer_fired: bool = False) -> None:
        while True:
            now = self._clock.now()
            with self._lock:
                alone = self._busy == 0
                batch, when = self._take_ready(now, timer_fired)
                booked = self._begin(batch, now) if batch else None
                inline = booked is not None and alone and self._runs_inline(*booked)
            timer_fired = False
            if booked is None:
                if when < math.inf:
                    self._arm_delay(when)
                self._after_loop_work()
                return
            run, expected_s = booked
            self._start(run, expected_s, inline)

    def _runs_inline(self, run: _Run, expected_s: float) -> bool:
        """Whether the loop runs this batch itself (under the lock; see :class:`InlineGate`):
        never while the loop is behind (a 3,000-connection flood ran 44 inline batches in 10 s,
        each waiting ~70 ms ticks to be dispatched and then settled)."""
        if self._loop_lag_s > _LOOP_BEHIND_S:
            return False
        return self._inline.allows(run.rows, expected_s, self._executor.inline_below_s)

    def _start(self, run: _Run, expected_s: float, inline: bool) -> None:
        try:
            job = self._job(run, expected_s, inline)
            if job is not None:
                self._executor.execute(job)
        except Exception as exc:  # the executor could not even start: fail this batch only
            with self._lock:
                self._unbook(run)
            self._fail(run.batch, exc)

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

    # -- completion (on the thread that ran the batch) ----------------------------------
    def _complete(
        self, run: _Run, result: RunResult | None, error: BaseException | None, chain: bool
    ) -> BatchJob | None:
        if not chain:
            # An inline run keeps its instance booked until the loop settles it, so the
            # requests read in the meantime queue up and go together (releasing it here
            # made every later request of the tick start a batch of its own: 2.3 rows per
            # batch instead of 18.9 for small_mlp at c=64, 0.55x the requests/s).
            self._loop.call_soon(partial(self._settle, run, result, error, True))
            return None
        now = self._clock.now()
        booked = None
        with self._lock:
            self._release(run, result)
            if self._loop_is_behind(now):
                batch = self._take_ready(now, False)[0]
                booked = self._begin(batch, now) if batch else None
        following = self._job(booked[0], booked[1], False) if booked is not None else None
        with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
            self._loop.call_soon_threadsafe(partial(self._settle, run, result, error, False))
        return following

    def _loop_is_behind(self, now: float) -> bool:
        """Whether a worker should take the next batch itself (under the lock).

        Only when the loop is late: a full batch is already queued, or the oldest request
        has waited past the batching delay. Otherwise the loop, which is reading the requests
        that would join, dispatches it: chaining whatever few requests are queued made
        batches half as large and cost 20-45% more CPU per request on one core.
        """
        head = self._head()
        if head is None:
            return False
        policy = self._policy
        if not policy.max_batch_size or self._queued_rows >= policy.max_batch_size:
            return True
        return now - head.arrival >= policy.max_queue_delay_s

    def _unbook(self, run: _Run) -> None:
        """Undo :meth:`_begin` (under the lock): the instance and the run's requests are free."""
        self._changes += 1
        self._busy -= 1
        self._busy_until.remove(run.expected_end)
        self._running_requests -= len(run.batch)

    def _release(self, run: _Run, result: RunResult | None) -> None:
        """Free the run's instance and learn from its time (under the lock)."""
        self._unbook(run)
        if result is not None:
            self.cost_model.observe(run.rows, result[1])
            self._inline.observe(run.rows, result[1])
            if self._policy.adaptive_concurrency and self.concurrency is not None:
                now = self._clock.now()
                for pending in run.batch:
                    self.concurrency.observe(now - pending.arrival)

    def _settle(
        self, run: _Run, result: RunResult | None, error: BaseException | None, release: bool
    ) -> None:
        """On the loop: answer the batch's requests, report it, dispatch what is waiting."""
        if release:
            with self._lock:
                self._release(run, result)
        for pending, refusal in run.refused:
            if not pending.future.done():
                pending.future.set_exception(refusal)
        if run.batch:
            self._report(run, result, error)
        if self._full_batch_queued():
            self._dispatch()
        elif self._queued_requests:
            self._dispatch_at_tick_end_once()
        else:
            self._after_loop_work()  # nothing waits: no dispatch to schedule

    def _report(self, run: _Run, result: RunResult | None, error: BaseException | None) -> None:
        """Answer the run's requests with their rows (or its error) and record the batch."""
        split_s = 0.0
        if result is not None:
            split_start = self._clock.now()
            self._deliver(run.batch, result[0])
            split_s = self._clock.now() - split_start
        elif isinstance(error, asyncio.CancelledError):  # the executor was shut down under it
            self._fail(run.batch, ModelNotReady("the model was unloaded while this batch waited to run"))
        else:
            self._fail(run.batch, error or InferenceError("the batch produced no result"))
        run_s = result[1] if result is not None else 0.0
        self.observer.on_batch(
            BatchRecord(len(run.batch), run.rows, run.waits, run.assemble_s, run_s, split_s, result is None)
        )

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

    # -- lifecycle ----------------------------------------------------------------------
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
        with self._lock:
            for lane in self._lanes:
                while lane.queue:
                    pending = lane.queue.popleft()
                    if pending.live:
                        self._drop(pending, ModelNotReady(reason))
        self._after_loop_work()


def _slack(margin_s: float, busy_for_s: float) -> float:
    """How long a refusal by ``margin_s`` stays right: the margin shrinks with the clock only
    while an instance is still busy (``busy_for_s``), and then no more."""
    return math.inf if margin_s > busy_for_s else margin_s


def _assemble(batch: Sequence[_Pending]) -> Feeds:
    if len(batch) == 1:
        return batch[0].feeds
    names = batch[0].feeds.keys()
    return {name: np.concatenate([p.feeds[name] for p in batch]) for name in names}


def _concurrency_limit(policy: SchedulingPolicy, instances: int) -> AdaptiveLimit | None:
    """The limit on requests held, fixed or adaptive; None when the policy sets none."""
    if policy.concurrency is not None:
        fixed = policy.concurrency
        return AdaptiveLimit(fixed, fixed, fixed)
    if not policy.adaptive_concurrency:
        return None
    running = instances * max(1, policy.max_batch_size)
    # At least a batch for each instance; at most the queue bound plus what runs at once;
    # starting with two batches' worth each, which the first windows correct either way.
    return AdaptiveLimit(2 * running, running, policy.max_queue_size + running)
