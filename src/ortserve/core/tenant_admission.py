"""Admission of one served version with tenancy on: the scheduler's refusals that read the
tenants' shares of the queue.

Split out of :mod:`ortserve.core.scheduler` so that the scheduler coordinates and this
module decides: while the queue holds one tenant's work, a request of that tenant is
admitted as without tenancy (:class:`~ortserve.core.admission.Admission`); else the
queue's shares (:mod:`~ortserve.core.fairness`) decide, and a full queue first makes room
for a tenant under its share. The scheduler calls it only once a request has named its
tenant; without tenancy nothing here runs.

Not locked itself: :meth:`TenantAdmission.refusal` runs under the scheduler's lock
(``lock``, shared here), :meth:`TenantAdmission.verdict` takes it where it reads the shares.
"""

from __future__ import annotations

import threading

from ortserve.core.admission import Admission
from ortserve.core.backlog import Backlog
from ortserve.core.batch import Pending
from ortserve.core.clock import Clock
from ortserve.core.fairness import tenant_key
from ortserve.core.policy import SchedulingPolicy
from ortserve.errors import Overloaded

__all__ = ["TenantAdmission"]


class TenantAdmission:
    """Admits or refuses the requests of one scheduler by their tenants' shares of its queue.

    Args:
        backlog: the queued and running work (its newest request of the tenant holding most
            may be pushed out of a full queue).
        admission: the tenant-blind arithmetic and its kept verdicts.
        policy: the queueing rules.
        clock: time source.
        lock: the scheduler's lock, which guards the backlog.
    """

    __slots__ = ("_admission", "_backlog", "_clock", "_lock", "_policy")

    def __init__(
        self,
        backlog: Backlog,
        admission: Admission,
        policy: SchedulingPolicy,
        clock: Clock,
        lock: threading.Lock,
    ) -> None:
        self._backlog = backlog
        self._admission = admission
        self._policy = policy
        self._clock = clock
        self._lock = lock

    def refusal(
        self, pending: Pending, tenant: str | None, as_at_edge: bool, now: float, deadline: float | None
    ) -> Overloaded | None:
        """Admission with tenancy on (under the lock). While the queue holds one tenant's work
        and this request is that tenant's, as without tenancy (nothing more is kept: see
        ``Backlog.solo``); else with the queue's shares (:meth:`_fair_refusal`)."""
        pending.tenant = tenant
        backlog = self._backlog
        if backlog.shares is None:
            key = tenant_key(pending)
            if backlog.queued_requests == 0 or backlog.solo == key:
                backlog.solo = key
                if as_at_edge and self._admission.still_admitted(pending.lane):
                    return None  # the edge's verdict (Scheduler.refusal()) still holds
                return self._admission.refusal(now, pending.rows, pending.lane, deadline)
        return self._fair_refusal(pending, now, deadline)

    def _fair_refusal(self, pending: Pending, now: float, deadline: float | None) -> Overloaded | None:
        """Admission with the queue shared by tenants (under the lock): a full queue first
        makes room for a tenant under its share, pushing out the newest request of the tenant
        holding the most (answered 429 on the loop)."""
        backlog = self._backlog
        shares = backlog.share_by_tenant()
        tenant = tenant_key(pending)
        bound = self._policy.max_queue_size
        if backlog.queued_requests >= bound and shares.requests.get(tenant, 0) < max(
            1, bound // shares.tenants_with(tenant)
        ):
            victim = shares.newest_of_largest()
            if victim is not None and tenant_key(victim) != tenant:
                backlog.drop(
                    victim,
                    Overloaded(
                        "pushed out of a full queue: its tenant held more than its share",
                        retry_after_s=self._admission.drain_estimate(now, backlog.queued_rows),
                    ),
                )
        return self._admission.refusal(now, pending.rows, pending.lane, deadline, tenant)

    def verdict(self, lane: int, tenant: str, blind: Overloaded) -> Overloaded | None:
        """What ``submit`` would answer a one-row request of ``tenant`` that the tenant-blind
        verdict refuses: the same while only its own work is queued, else by its share."""
        backlog = self._backlog
        if backlog.shares is None and (backlog.queued_requests == 0 or backlog.solo == tenant):
            return blind
        now = self._clock.now()
        timeout_s = self._policy.default_timeout_s
        bound = self._policy.max_queue_size
        with self._lock:
            shares = backlog.share_by_tenant()
            if backlog.queued_requests >= bound and shares.requests.get(tenant, 0) < max(
                1, bound // shares.tenants_with(tenant)
            ):
                return None  # its submit pushes out the newest of the tenant holding most
            error = self._admission.refusal(
                now, 1, lane, None if timeout_s is None else now + timeout_s, tenant
            )
        # Answered with the kept verdict's error, encoded once by the edge: a fresh one per
        # refused request of a flooding tenant cost its encoding each time.
        return None if error is None else blind
