"""Each tenant's share of one served version's queue: fair batches and fair admission.

Tenancy on (``--api-key``, ``--tenant-quota``: the request edge names a tenant), a model's
queue is shared by tenants who may send very different loads. Without shares, one tenant's
burst fills the queue (the others are refused "queue full") and, admitted, the others wait
behind all of it (FIFO). With them, while two or more tenants have queued work:

- batches are taken round-robin over the tenants' own FIFO lanes, within each priority lane
  (one request from each tenant in turn; a tenant served moves to the back), so a quiet
  tenant's request goes in the next batch however deep the flood ahead of it;
- a tenant holding its share of the queue bound (``max_queue_size`` / tenants queued) is
  refused (429 + Retry-After) while the others are under theirs, and a full queue makes room
  for a tenant under its share by pushing out the newest request of the tenant holding most;
- the wait admission counts ahead of a tenant's request is what round-robin puts ahead of it
  (its own queued rows, once per tenant), not the whole queue.

One tenant (or tenancy off: nothing is kept at all) keeps the FIFO path as it was. The books
kept here are lazy like the lanes': a request that leaves is only marked (``Pending.live``)
and its entry dropped when reached, or when a lane holds more dead entries than live ones.

Not locked itself: used under the scheduler's lock, like the :class:`Backlog` that owns it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from ortserve.core.batch import Pending

__all__ = ["TenantShares", "tenant_key"]

_UNNAMED = ""
"""The key of requests that name no tenant (a pipeline's own model calls)."""


def tenant_key(pending: Pending) -> str:
    """The tenant a queued request is counted under."""
    return pending.tenant or _UNNAMED


class TenantShares:
    """Per-tenant FIFO lanes (one per priority lane) and the counts fair admission reads.

    Args:
        priority_levels: how many priority lanes.
    """

    __slots__ = ("lanes", "requests", "rows")

    def __init__(self, priority_levels: int) -> None:
        self.lanes: list[dict[str, deque[Pending]]] = [{} for _ in range(priority_levels)]
        """Per priority lane, each tenant's queued requests, oldest first; the next tenant to
        serve first (dict order: a tenant served moves to the end)."""
        self.requests: dict[str, int] = {}
        """Live queued requests per tenant; a tenant with none is not a key."""
        self.rows: dict[str, int] = {}
        """Live queued rows per tenant."""

    @property
    def contended(self) -> bool:
        """Whether two or more tenants have queued work (only then is the order fair)."""
        return len(self.requests) > 1

    def tenants_with(self, tenant: str) -> int:
        """The tenants queued, counting ``tenant`` (about to queue) among them."""
        return len(self.requests) + (tenant not in self.requests)

    def add(self, pending: Pending) -> None:
        tenant = tenant_key(pending)
        lane = self.lanes[pending.lane]
        queue = lane.get(tenant)
        if queue is None:
            queue = lane[tenant] = deque()
        queue.append(pending)
        self.requests[tenant] = self.requests.get(tenant, 0) + 1
        self.rows[tenant] = self.rows.get(tenant, 0) + pending.rows

    def add_all(self, pendings: Iterable[Pending]) -> None:
        for pending in pendings:
            if pending.live:
                self.add(pending)

    def remove(self, pending: Pending) -> None:
        """``pending`` left the queue (already marked not live)."""
        tenant = tenant_key(pending)
        left = self.requests[tenant] - 1
        if left == 0:
            del self.requests[tenant], self.rows[tenant]
            for lane in self.lanes:
                lane.pop(tenant, None)
            return
        self.requests[tenant] = left
        self.rows[tenant] -= pending.rows
        queue = self.lanes[pending.lane].get(tenant)
        if queue is None:
            return
        while queue and not queue[0].live:
            queue.popleft()
        if len(queue) > 2 * left + 32:  # left from the middle (deadline, cancel): compact
            live = [p for p in queue if p.live]
            queue.clear()
            queue.extend(live)
        if not queue:
            del self.lanes[pending.lane][tenant]

    # -- admission -------------------------------------------------------------------------
    def over_share(self, tenant: str, bound: int) -> bool:
        """Whether ``tenant`` holds its share of a queue of ``bound`` requests while another
        tenant has queued work too."""
        held = self.requests.get(tenant, 0)
        return held > 0 and len(self.requests) > 1 and held >= max(1, bound // len(self.requests))

    def rows_ahead(self, tenant: str, rows: int) -> int:
        """The rows round-robin runs before a new request of ``rows`` rows of ``tenant`` is
        done, at most: its own queued rows and the new ones, once per tenant queued."""
        return (self.rows.get(tenant, 0) + rows) * self.tenants_with(tenant) - rows

    def newest_of_largest(self) -> Pending | None:
        """The newest live request of the tenant holding the most queued requests."""
        if not self.requests:
            return None
        largest = max(self.requests, key=self.requests.__getitem__)
        for lane in reversed(self.lanes):
            queue = lane.get(largest)
            while queue:
                if queue[-1].live:
                    return queue[-1]
                queue.pop()
        return None

    # -- taking batches --------------------------------------------------------------------
    def take(self, max_rows: int, usable: Callable[[Pending], bool]) -> list[Pending]:
        """A batch taken round-robin: the first tenant's oldest request of the most urgent
        lane, then one request from each tenant in turn while the batch has room (the same
        input shapes, at most ``max_rows`` rows; 0: one request). ``usable`` says whether a
        live request may still run (else it has left the queue, dropped or removed); taken
        requests are still to be removed by the caller."""
        batch: list[Pending] = []
        rows = 0
        signature: tuple[tuple[int, ...], ...] = ()
        for lane in self.lanes:
            open_tenants = list(lane)
            while open_tenants and (not batch or (max_rows and rows < max_rows)):
                still_open: list[str] = []
                for tenant in open_tenants:
                    queue = lane.get(tenant)
                    pending = _front(queue, usable)
                    if queue is None or pending is None:
                        continue
                    if batch and (pending.signature != signature or rows + pending.rows > max_rows):
                        continue  # this tenant's next request waits for another batch
                    if not batch:
                        signature = pending.signature
                    queue.popleft()
                    batch.append(pending)
                    rows += pending.rows
                    if queue:
                        lane[tenant] = lane.pop(tenant)  # served: to the back of the turn
                        still_open.append(tenant)
                    if max_rows == 0 or rows >= max_rows:
                        return batch
                open_tenants = still_open
        return batch


def _front(queue: deque[Pending] | None, usable: Callable[[Pending], bool]) -> Pending | None:
    """The oldest request of ``queue`` that may run; those that left are popped on the way."""
    while queue:
        pending = queue[0]
        if pending.live and usable(pending):
            return pending
        if queue and queue[0] is pending:  # ``usable`` may have dropped it, popping it too
            queue.popleft()
    return None
