"""Admission control of one served version: whether a request may join the queue, from the
work queued and running ahead of it, and the verdicts kept while that work stands."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ortserve.core.adaptive import AdaptiveLimit
from ortserve.core.clock import Clock
from ortserve.core.costmodel import BatchCostModel
from ortserve.core.policy import AUTO_WAIT_BATCHES, SchedulingPolicy, queue_wait_target
from ortserve.core.read_delay import ReadDelay
from ortserve.errors import DeadlineUnmeetable, Overloaded

if TYPE_CHECKING:
    from ortserve.core.backlog import Backlog

__all__ = ["Admission", "concurrency_limit", "full_batch_s", "in_flight_capacity", "wait_target"]


@dataclass(frozen=True, slots=True)
class _KeptRefusal:
    """A refusal answered at ``changes`` (the backlog's change count), right until ``until``."""

    error: Overloaded
    changes: int
    until: float


class Admission:
    """Admits or refuses the requests of one scheduler, reading its backlog.

    The counts it decides on belong to the :class:`~ortserve.core.backlog.Backlog` and are
    guarded by the scheduler's lock (``lock``, shared here): the arithmetic runs under it.
    The verdicts kept per lane are written only here, under the same lock, and read without
    it (a list item and an int, compared to the backlog's change count).

    Args:
        backlog: the queued and running work (read only).
        policy: the queueing rules.
        cost_model: the batch cost estimate.
        concurrency: the limit on requests held, or None (see :func:`concurrency_limit`).
        clock: time source.
        lock: the scheduler's lock, which guards the backlog.
        read_delay: how long requests now sit unread before the transports read them
            (:mod:`ortserve.core.read_delay`), added to the wait ahead; None: not known.
    """

    __slots__ = (
        "_admitted",
        "_backlog",
        "_clock",
        "_concurrency",
        "_cost_model",
        "_kept",
        "_lock",
        "_policy",
        "_read_delay",
    )

    def __init__(
        self,
        backlog: Backlog,
        policy: SchedulingPolicy,
        cost_model: BatchCostModel,
        concurrency: AdaptiveLimit | None,
        clock: Clock,
        lock: threading.Lock,
        read_delay: ReadDelay | None = None,
    ) -> None:
        self._read_delay = read_delay
        self._backlog = backlog
        self._policy = policy
        self._cost_model = cost_model
        self._concurrency = concurrency
        self._clock = clock
        self._lock = lock
        self._kept: list[_KeptRefusal | None] = [None] * policy.priority_levels
        # Per lane, the change count at which a one-row request with the default timeout was
        # last admitted: with the counts unchanged it is still admitted (see still_admitted).
        self._admitted = [-1] * policy.priority_levels

    def verdict(self, lane: int) -> Overloaded | None:
        """The refusal a one-row request with the default timeout would get now in ``lane``.

        Under overload nearly every request asks (``Scheduler.refusal``), and the answer
        rarely changes between two changes of the queue: a verdict is kept, per lane, until
        the queue, the running batches or the cost model change, or until time alone could
        make a refusal wrong, so answering costs a lookup.
        """
        backlog = self._backlog
        if self._admitted[lane] == backlog.changes:  # still_admitted, without the call
            return None
        now = self._clock.now()
        kept = self._kept[lane]
        if kept is not None and kept.changes == backlog.changes and now < kept.until:
            return kept.error
        timeout_s = self._policy.default_timeout_s
        with self._lock:
            error, slack_s = self.refusal_and_slack(
                now, 1, lane, None if timeout_s is None else now + timeout_s
            )
            if error is None:
                self._admitted[lane] = backlog.changes
                self._kept[lane] = None
            else:
                self._kept[lane] = _KeptRefusal(error, backlog.changes, now + slack_s)
        return error

    def still_admitted(self, lane: int) -> bool:
        """Whether a one-row request with the default timeout admitted to ``lane`` at the
        current change count would still be admitted now.

        With the counts unchanged, time only relaxes admission: a wait ahead shrinks while the
        running batches near their end and stays put once they are due, and a finish past the
        deadline or budget gets no closer to it (both move with the clock once nothing is
        running). So the edge's verdict (:meth:`verdict`) stands for the request's own
        ``Scheduler.submit`` that follows in the same tick, which then skips the arithmetic;
        any change to the queue, the running batches or the cost model bumps the count.
        """
        return self._admitted[lane] == self._backlog.changes

    # -- the arithmetic (under the lock) -----------------------------------------------
    def refusal(
        self, now: float, rows: int, lane: int, deadline: float | None, tenant: str | None = None
    ) -> Overloaded | None:
        """The refusal a request of ``rows`` rows ending by ``deadline`` gets now, or None;
        ``tenant``: its tenant's key while the backlog keeps shares (:mod:`~ortserve.core.fairness`)."""
        return self.refusal_and_slack(now, rows, lane, deadline, tenant)[0]

    def refusal_and_slack(
        self, now: float, rows: int, lane: int, deadline: float | None, tenant: str | None = None
    ) -> tuple[Overloaded | None, float]:
        """The refusal, and how long it stays right if the queue does not change.

        A refusal by a count (queue bound, concurrency limit) stays right until the counts
        change. One by a margin of time (the wait over the target, the finish past the
        deadline or budget, which move with the clock) shrinks only while the instances are
        all busy and the running batches get closer to done, by the time passed: right for
        ``margin`` seconds, or until the counts change if the margin outlasts the busy time.
        """
        policy = self._policy
        backlog = self._backlog
        if backlog.queued_requests >= policy.max_queue_size:
            full = Overloaded(
                f"queue full ({policy.max_queue_size} requests waiting)",
                retry_after_s=self._drain_estimate(now, backlog.queued_rows),
            )
            return full, math.inf
        concurrency = self._concurrency
        if (
            concurrency is not None
            and backlog.queued_requests + backlog.running_requests >= concurrency.limit
        ):
            held = Overloaded(
                f"concurrency limit reached ({concurrency.limit} requests held)",
                retry_after_s=self._drain_estimate(now, backlog.queued_rows),
            )
            return held, math.inf
        shares = backlog.shares if tenant is not None else None
        if shares is not None and tenant is not None and shares.over_share(tenant, policy.max_queue_size):
            over = Overloaded(
                f"this tenant holds its share of the queue ({shares.requests[tenant]} of "
                f"{policy.max_queue_size} requests, {len(shares.requests)} tenants queued)",
                retry_after_s=self._drain_estimate(now, shares.rows_ahead(tenant, 0)),
            )
            return over, math.inf
        if not self._cost_model.fitted:
            return None, 0.0
        ahead = sum(backlog.lanes[i].rows for i in range(lane + 1))
        if shares is not None and tenant is not None:
            ahead = min(ahead, shares.rows_ahead(tenant, rows))  # round-robin: its turns only
        queued = self._drain_estimate(now, ahead)
        batch_s = full_batch_s(policy, self._cost_model) * backlog.service.slowdown
        target = queue_wait_target(policy, batch_s)
        unread = self._read_delay.unread_s if self._read_delay is not None else 0.0
        if unread <= batch_s:
            # A lag within one batch is the margin the target keeps for the hand-over (and a
            # sample's jitter): counted, it refused the third of three requests to an unbatched
            # model whenever the first had just started. Longer, the loop is behind its reads.
            unread = 0.0
        wait = queued + unread
        if wait > target and not backlog.within_capacity(rows):
            late = Overloaded(
                f"about {wait * 1e3:.1f} ms of waiting ahead ({unread * 1e3:.1f} ms of it unread "
                f"in the socket), more than the {target * 1e3:.1f} ms queue-wait target",
                retry_after_s=queued,
            )
            # The unread wait moves with every read, not with the counts: a refusal it
            # decided is not kept past this request.
            slack = _slack(wait - target, self._busy_for(now)) if queued > target else 0.0
            return late, slack
        limit = deadline
        if policy.latency_budget_s is not None:
            budget_end = now + policy.latency_budget_s
            limit = budget_end if limit is None else min(limit, budget_end)
        if limit is None:
            return None, 0.0
        finish = self._drain_estimate(now, ahead + rows, absolute=True)
        if finish > limit:
            # The client's deadline binding: 504 DEADLINE_EXCEEDED; the server's budget: 429.
            missed = (DeadlineUnmeetable if limit == deadline else Overloaded)(
                f"cannot finish within the deadline: about {(finish - now) * 1e3:.1f} ms of work "
                "is queued ahead",
                retry_after_s=finish - now,
            )
            return missed, _slack(finish - limit, self._busy_for(now))
        return None, 0.0

    def _busy_for(self, now: float) -> float:
        """How long until an instance is free, by the running batches' predicted ends."""
        backlog = self._backlog
        if backlog.busy < backlog.instances:
            return 0.0
        return max(0.0, min(backlog.busy_until, default=now) - now)

    def drain_estimate(self, now: float, rows: int) -> float:
        """How long until ``rows`` queued rows would be done (a Retry-After)."""
        return self._drain_estimate(now, rows)

    def _drain_estimate(self, now: float, rows: int, absolute: bool = False) -> float:
        """When ``rows`` queued rows would be done, given the batches running now, at the
        service rate measured (:class:`~ortserve.core.adaptive.ServiceMeter`)."""
        instances = self._backlog.instances
        free_at = now + self._busy_for(now)
        per_batch = self._policy.max_batch_size or 1
        batches = math.ceil(rows / per_batch) if rows else 0
        full_cost = self._cost_model.predict(min(per_batch, max(rows, 1)))
        work = batches * full_cost * self._backlog.service.slowdown / instances
        finish = free_at + work
        return finish if absolute else max(0.0, finish - now)


def full_batch_s(policy: SchedulingPolicy, cost_model: BatchCostModel) -> float:
    """A full batch's predicted time, which the queue-wait target is counted in."""
    return cost_model.predict(policy.max_batch_size or 1)


def wait_target(policy: SchedulingPolicy, cost_model: BatchCostModel, slowdown: float) -> float:
    """The queue-wait target now: automatic, it is counted in full batches of the service
    measured (the predicted run time times the measured ``slowdown``), so a machine that serves
    more slowly waits longer instead of refusing; a configured one is taken as given."""
    return queue_wait_target(policy, full_batch_s(policy, cost_model) * slowdown)


def in_flight_capacity(policy: SchedulingPolicy, instances: int) -> int:
    """The rows a server may hold (queued and running) that are never refused or shed for
    their wait with the automatic queue-wait target: a full batch running on each instance
    and the next one queued behind it, ``AUTO_WAIT_BATCHES`` batches per instance.

    A closed loop that holds no more than this is a load the runner serves at its own pace.
    The time test alone refused some of it: on a busy machine the loop reads a closed loop's
    requests in fragments, a short batch starts, the rest queue past one full batch, and the
    work ahead then counts more than two batches (issue 30: 64 connections on heavy_mlp with
    batches of 32). A configured target (``max_queue_wait_ms``) is the operator's and has no
    such floor (0: none)."""
    if policy.max_queue_wait_s is not None:
        return 0
    return AUTO_WAIT_BATCHES * instances * max(1, policy.max_batch_size)


def concurrency_limit(policy: SchedulingPolicy, instances: int) -> AdaptiveLimit | None:
    """The limit on requests held, fixed or adaptive; None when the policy sets none."""
    if policy.concurrency is not None:
        fixed = policy.concurrency
        return AdaptiveLimit(fixed, fixed, fixed)
    if not policy.adaptive_concurrency:
        return None
    running = instances * max(1, policy.max_batch_size)
    # At least the batch capacity in flight (a batch running on each instance and the next
    # queued: a closed loop that holds no more is never refused, however slow the machine);
    # at most the queue bound plus what runs at once.
    floor = AUTO_WAIT_BATCHES * running
    return AdaptiveLimit(floor, floor, policy.max_queue_size + running)


def _slack(margin_s: float, busy_for_s: float) -> float:
    """How long a refusal by ``margin_s`` stays right: the margin shrinks with the clock only
    while an instance is still busy (``busy_for_s``), and then no more."""
    return math.inf if margin_s > busy_for_s else margin_s
