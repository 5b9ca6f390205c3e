"""The work of one served version, queued and running: priority lanes, the counts admission
reads, and the taking of the next batch by the batching rules."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

from ortserve.core.adaptive import ServiceMeter
from ortserve.core.admission import in_flight_capacity, wait_target
from ortserve.core.batch import Pending, Run
from ortserve.core.clock import TimerHandle
from ortserve.core.costmodel import BatchCostModel
from ortserve.core.fairness import ActiveTenants, TenantShares, tenant_key
from ortserve.core.policy import SchedulingPolicy, StandingQueue
from ortserve.errors import DeadlineExceeded, ModelNotReady, OrtServeError, Overloaded

__all__ = ["Backlog", "Lane"]


@dataclass(slots=True, eq=False)
class Lane:
    """The requests queued at one priority, oldest first, and their rows."""

    queue: deque[Pending] = field(default_factory=deque)
    rows: int = 0


class Backlog:
    """The queued and running requests of one scheduler, and the batches taken from them.

    Not locked itself: the event loop and the workers both take batches, so every method and
    field is used under the scheduler's lock (``Scheduler._lock``), the one lock that guards
    all of it. Each field has one writer, this class, except ``dropped`` and
    ``stale_timers``: filled here, emptied by the scheduler on the loop, which answers and
    cancels what they hold there.

    Args:
        policy: the batching and queueing rules.
        cost_model: the batch cost estimate (shared with the scheduler, which teaches it).
        instances: how many batches may run at the same time (the executor's, fixed).
        priority_levels: how many lanes.
    """

    __slots__ = (
        "_capacity",
        "_cost_model",
        "_policy",
        "_standing",
        "active",
        "busy",
        "busy_until",
        "changes",
        "dropped",
        "instances",
        "lanes",
        "queued_requests",
        "queued_rows",
        "running_requests",
        "running_rows",
        "service",
        "shares",
        "solo",
        "stale_timers",
    )

    def __init__(self, policy: SchedulingPolicy, cost_model: BatchCostModel, instances: int) -> None:
        self._policy = policy
        self._cost_model = cost_model
        self.instances = instances
        self.lanes = [Lane() for _ in range(policy.priority_levels)]
        self.queued_requests = 0
        self.queued_rows = 0
        self.running_requests = 0
        self.running_rows = 0
        self.busy = 0
        """Batches running (booked on an instance)."""
        self.busy_until: list[float] = []
        """Each running batch's predicted end."""
        self.changes = 0
        """Bumped by every change admission reads (queue, running batches, cost model), so a
        kept verdict knows when it may have gone stale; read without the lock (an int)."""
        self.dropped: list[tuple[Pending, OrtServeError]] = []
        """Requests that left unrun, to answer on the loop."""
        self.stale_timers: list[TimerHandle] = []
        """Deadline timers of requests that left, to cancel on the loop."""
        self._standing = StandingQueue()
        self._capacity = in_flight_capacity(policy, instances)
        self.service = ServiceMeter()
        """The measured service time per predicted run time (see :class:`ServiceMeter`)."""
        self.shares: TenantShares | None = None
        """Each tenant's queued work, while two or more tenants have some (see
        :meth:`share_by_tenant`); None: tenancy off, or one tenant's work (``solo``) queued."""
        self.solo = ""
        """With tenancy on and no shares kept, the tenant whose work is queued (if any is)."""
        self.active: ActiveTenants | None = None
        """With tenancy on, the tenants seen lately and those running (see :class:`ActiveTenants`)."""

    def share_by_tenant(self) -> TenantShares:
        """Keep each tenant's share of the queue (a second tenant's request came); the requests
        already queued, all ``solo``'s, are counted too (once: bounded by the queue)."""
        if self.shares is None:
            self.shares = TenantShares(len(self.lanes))
            for lane in self.lanes:
                self.shares.add_all(lane.queue)
        return self.shares

    # -- joining and leaving the queue ---------------------------------------------------
    def add(self, pending: Pending) -> None:
        self.changes += 1
        lane = self.lanes[pending.lane]
        lane.queue.append(pending)
        lane.rows += pending.rows
        self.queued_requests += 1
        self.queued_rows += pending.rows
        if self.shares is not None:
            self.shares.add(pending)
        if pending.tenant is not None:
            if self.active is None:
                self.active = ActiveTenants()
            self.active.arrived(pending)

    def remove(self, pending: Pending) -> None:
        """Take a request off the books; its timer is cancelled on the loop."""
        pending.live = False
        self.changes += 1
        self.queued_requests -= 1
        self.queued_rows -= pending.rows
        self.lanes[pending.lane].rows -= pending.rows
        shares = self.shares
        if shares is not None:
            shares.remove(pending)
            if not shares.contended:  # one tenant left: back to the plain FIFO, nothing kept
                self.solo = next(iter(shares.requests), "")
                self.shares = None
        if pending.timer is not None:
            self.stale_timers.append(pending.timer)
            pending.timer = None

    def drop(self, pending: Pending, error: OrtServeError) -> None:
        """Take a request off the books unrun; the loop answers it with ``error``."""
        self.remove(pending)
        self.dropped.append((pending, error))

    def drop_all(self, reason: str) -> None:
        """Drop every queued request (the model is going away), each with its own error."""
        for lane in self.lanes:
            while lane.queue:
                pending = lane.queue.popleft()
                if pending.live:
                    self.drop(pending, ModelNotReady(reason))

    def within_capacity(self, rows: int = 0) -> bool:
        """Whether the rows held (queued and running), and ``rows`` more, fit in the batch
        capacity in flight, with the automatic queue-wait target (see
        :func:`~ortserve.core.admission.in_flight_capacity`): such a load is never refused
        or shed for its wait, however slow the machine."""
        return self.queued_rows + self.running_rows + rows <= self._capacity

    def full_batch_queued(self) -> bool:
        """Whether waiting for more company cannot make the next batch larger."""
        return self.queued_rows >= (self._policy.max_batch_size or 1)

    # -- taking batches --------------------------------------------------------------------
    def head(self) -> Pending | None:
        """The oldest live request of the most urgent lane; the ones its client abandoned ahead of
        it leave the books on the way."""
        for lane in self.lanes:
            queue = lane.queue
            while queue:
                head = queue[0]
                if head.live and not head.future.done():
                    return head
                queue.popleft()
                if head.live:  # cancelled by its client while queued
                    self.remove(head)
        return None

    def take_ready(self, now: float, timer_fired: bool) -> tuple[list[Pending], float]:
        """A batch to start now and the instance marked busy, or ``([], when to look again)``
        (inf: nothing queued)."""
        while self.busy < self.instances:
            head = self.head()
            if head is None:
                return [], math.inf
            wait_until = self._wait_until(head, now)
            # A fired delay timer means the wait is over, even when the loop's millisecond
            # timer resolution woke us a fraction early: re-arming would only spin.
            if wait_until > now and not timer_fired:
                return [], wait_until
            kept = () if self.active is None else self.active.kept_from(now, self.busy, self.instances)
            batch = self._take_batch(head, now, kept)
            if batch:
                self.busy += 1
                return batch, now
            if kept:  # the last instance waits for a tenant with nothing running (or an end)
                return [], math.inf
        return [], math.inf

    def _wait_until(self, head: Pending, now: float) -> float:
        """When to stop waiting for company; ``now`` or earlier means go at once."""
        policy = self._policy
        if not policy.max_batch_size or self.busy == 0:
            return now  # no batching, or the runner is idle: run at once
        rows = self.queued_rows
        if rows >= policy.max_batch_size:
            return now
        preferred = policy.preferred_batch_sizes
        if preferred and (rows in preferred or rows >= max(preferred)):
            return now
        until = head.arrival + policy.max_queue_delay_s
        if policy.latency_budget_s is not None and self._cost_model.fitted:
            latest_start = head.arrival + policy.latency_budget_s - self._cost_model.predict(rows + 1)
            until = min(until, latest_start)
        return until

    def _take_batch(self, head: Pending, now: float, kept: Collection[str] = ()) -> list[Pending]:
        """The head request and the queued requests that fit beside it, in lane order.

        Requests whose deadline passed leave without running, and so do those that waited
        past the queue-wait target while the queue stands late (CoDel: running them only
        makes everyone behind them late too). The ``kept`` tenants' requests wait (the last
        free instance is kept for the others: :class:`ActiveTenants`).
        """
        max_rows = self._policy.max_batch_size
        target = wait_target(self._policy, self._cost_model, self.service.slowdown)
        shedding = (
            self._cost_model.fitted
            and self._standing.shedding(now - head.arrival, target, now)
            and not self.within_capacity()
        )
        shed_before = now - target if shedding else -math.inf
        late_before = self._late_before(now)
        if self.shares is not None and self.shares.contended:
            return self._take_fair(now, shed_before, late_before, kept)
        if kept and tenant_key(head) in kept:  # one tenant's work queued, and it has a batch running
            return []
        batch: list[Pending] = []
        rows = 0
        for lane in self.lanes:
            queue = lane.queue
            skipped: list[Pending] = []
            while queue and (not batch or (max_rows and rows < max_rows)):
                pending = queue.popleft()
                if not pending.live:
                    continue
                if pending.future.done():
                    self.remove(pending)
                    continue
                if pending.deadline is not None and pending.deadline <= now:
                    self.drop(pending, DeadlineExceeded("deadline passed while the request was queued"))
                    continue
                if pending.arrival < shed_before:
                    self.drop(pending, Overloaded("shed: waited too long in an overloaded queue", 0.0))
                    continue
                if pending.arrival < late_before:
                    self.drop(
                        pending, Overloaded("shed: it could no longer finish within the latency budget", 0.0)
                    )
                    continue
                fits = not batch or (pending.signature == head.signature and rows + pending.rows <= max_rows)
                if not fits:
                    skipped.append(pending)
                    if len(skipped) > 64:
                        break
                    continue
                self.remove(pending)
                batch.append(pending)
                rows += pending.rows
            queue.extendleft(reversed(skipped))
            if batch and (not max_rows or rows >= max_rows):
                break
        return batch

    def _take_fair(
        self, now: float, shed_before: float, late_before: float, kept: Collection[str] = ()
    ) -> list[Pending]:
        """:meth:`_take_batch` while two or more tenants have queued work: round-robin over
        the tenants (:meth:`TenantShares.take`), with the same requests leaving unrun."""

        def usable(pending: Pending) -> bool:
            if pending.future.done():
                self.remove(pending)
            elif pending.deadline is not None and pending.deadline <= now:
                self.drop(pending, DeadlineExceeded("deadline passed while the request was queued"))
            elif pending.arrival < shed_before:
                self.drop(pending, Overloaded("shed: waited too long in an overloaded queue", 0.0))
            elif pending.arrival < late_before:
                self.drop(
                    pending, Overloaded("shed: it could no longer finish within the latency budget", 0.0)
                )
            else:
                return True
            return False

        assert self.shares is not None
        batch = self.shares.take(self._policy.max_batch_size, usable, kept)
        for pending in batch:
            self.remove(pending)
        return batch

    def _late_before(self, now: float) -> float:
        """Requests that arrived before this would finish past the latency budget if the
        batch being formed ran now (-inf without a budget).

        Admission predicts the finish from the queue it sees; when batches then run longer
        than predicted (the machine slowed, the loop took the core) a request admitted within
        the budget could still be answered after it. Such a request leaves unrun with a 429
        instead: an answer past the budget is worth less to its client than a prompt refusal,
        and running it would make the requests behind it late too.
        """
        budget = self._policy.latency_budget_s
        if budget is None or not self._cost_model.fitted:
            return -math.inf
        rows = min(self._policy.max_batch_size or 1, max(1, self.queued_rows))
        return now + self._cost_model.predict(rows) - budget

    def loop_is_behind(self, now: float) -> bool:
        """Whether a worker should take the next batch itself.

        Only when the loop is late: a full batch is already queued, or the oldest request
        has waited past the batching delay. Otherwise the loop, which is reading the requests
        that would join, dispatches it: chaining whatever few requests are queued made
        batches half as large and cost 20-45% more CPU per request on one core.
        """
        head = self.head()
        if head is None:
            return False
        policy = self._policy
        if not policy.max_batch_size or self.queued_rows >= policy.max_batch_size:
            return True
        return now - head.arrival >= policy.max_queue_delay_s

    # -- running batches -------------------------------------------------------------------
    def begin(self, batch: list[Pending], now: float) -> tuple[Run, float]:
        """Book the batch as running; returns it and its predicted time (inf: not known)."""
        self.changes += 1
        rows = sum(p.rows for p in batch)
        predicted = self._cost_model.predict(rows)
        run = Run(batch, rows, now + predicted, tuple(now - p.arrival for p in batch), now)
        self.busy_until.append(run.expected_end)
        self.running_requests += len(batch)
        self.running_rows += rows
        if self.active is not None:
            requests: dict[str, int] = {}  # each tenant's requests in the batch
            for pending in batch:
                key = tenant_key(pending)
                requests[key] = requests.get(key, 0) + 1
            self.active.began(run, requests)
            run.bulk = self.instances > 1 and self.active.bulk(requests, now, self._backlogged)
        return run, predicted if self._cost_model.fitted else math.inf

    def _backlogged(self, tenant: str) -> bool:
        """Whether ``tenant`` has work queued (with no shares kept, all queued work is ``solo``'s)."""
        if self.shares is not None:
            return tenant in self.shares.requests
        return self.queued_requests > 0 and self.solo == tenant

    def unbook(self, run: Run) -> None:
        """Undo :meth:`begin`: the instance and the run's requests are free."""
        self.changes += 1
        self.busy -= 1
        self.busy_until.remove(run.expected_end)
        if self.active is not None:
            self.active.ended(run)
        self.running_requests -= len(run.batch)
        self.running_rows -= run.rows

    def served(self, run: Run, now: float) -> None:
        """``run`` ended with a result at ``now``: time its service (after :meth:`unbook`)."""
        oldest = run.started - max(run.waits, default=0.0)
        self.service.observe(run.started, oldest, now, run.expected_end - run.started)

    def screened_out(self, requests: int, rows: int) -> None:
        """``requests`` of ``rows`` rows left a running batch unrun (see ``Scheduler._screen_out``)."""
        self.changes += 1  # a kept admission verdict counted these requests
        self.running_requests -= requests
        self.running_rows -= rows
