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
  (its own queued rows, once per tenant), not the whole queue;
- with two or more instances (``instance_group`` count), while a tenant that sent a request
  within the last second has no batch running, the last free instance is kept for it
  (:class:`ActiveTenants`): a flood does not take every instance, so a quiet
  tenant's request starts at once instead of waiting for a flood's batch to end. On one core
  its run then shares the core with the flood's batch (the kernel favours the thread that
  was asleep) instead of queueing behind it: see benchmarks/RESULTS.md, "quiet tenant";
- and there a batch of tenants that each have more than one request in flight, while another
  tenant is active, runs in the bulk lane (:meth:`ActiveTenants.bulk`): on a worker thread of lower
  CPU weight (``runner.BULK_NICE``), so when a quiet tenant's run and a flood's batch are
  runnable on the same core the kernel gives the quiet one nearly all of it, instead of
  half.

One tenant (or tenancy off: nothing is kept at all) keeps the FIFO path as it was. The books
kept here are lazy like the lanes': a request that leaves is only marked (``Pending.live``)
and its entry dropped when reached, or when a lane holds more dead entries than live ones.

Not locked itself: used under the scheduler's lock, like the :class:`Backlog` that owns it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping

from ortserve.core.batch import Pending

__all__ = ["ACTIVE_S", "ActiveTenants", "TenantShares", "tenant_key"]

ACTIVE_S = 1.0
"""A tenant that sent a request this recently is active: a client sending one request at a
time, with gaps between them, still counts while it has nothing queued."""

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
    def take(
        self, max_rows: int, usable: Callable[[Pending], bool], excluded: Collection[str] = ()
    ) -> list[Pending]:
        """A batch taken round-robin: the first tenant's oldest request of the most urgent
        lane, then one request from each tenant in turn while the batch has room (the same
        input shapes, at most ``max_rows`` rows; 0: one request). ``usable`` says whether a
        live request may still run (else it has left the queue, dropped or removed); taken
        requests are still to be removed by the caller. The ``excluded`` tenants' requests
        wait (see :class:`ActiveTenants`)."""
        batch: list[Pending] = []
        rows = 0
        signature: tuple[tuple[int, ...], ...] = ()
        for lane in self.lanes:
            open_tenants = [t for t in lane if t not in excluded] if excluded else list(lane)
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


class ActiveTenants:
    """Which tenants sent requests lately and which have batches running, to keep the last free
    instance of a version with several for the tenants that have none running.

    Kept only with tenancy on (a request named its tenant); under the scheduler's lock.
    """

    __slots__ = ("_runs", "running", "seen")

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}
        """Each tenant's latest arrival."""
        self.running: dict[str, int] = {}
        """Batches running that hold a request of the tenant; a tenant with none is not a key."""
        self._runs: dict[int, tuple[str, ...]] = {}
        """The tenants of each running batch, by ``id`` of its run."""

    def arrived(self, pending: Pending) -> None:
        self.seen[tenant_key(pending)] = pending.arrival
        if len(self.seen) > 64:  # forget the long gone (a loop per 64 tenants' arrivals)
            newest = max(self.seen.values())
            self.seen = {t: at for t, at in self.seen.items() if at > newest - ACTIVE_S}

    def began(self, run: object, tenants: Collection[str]) -> None:
        self._runs[id(run)] = tuple(tenants)
        for tenant in tenants:
            self.running[tenant] = self.running.get(tenant, 0) + 1

    def ended(self, run: object) -> None:
        for tenant in self._runs.pop(id(run), ()):
            left = self.running[tenant] - 1
            if left:
                self.running[tenant] = left
            else:
                del self.running[tenant]

    def kept_from(self, now: float, busy: int, instances: int) -> Collection[str]:
        """The tenants that may not take the next free instance: those with a batch running,
        when it is the last one free and an active tenant has none running (it is kept for
        that one); else none (a batch holding every active tenant keeps nothing back)."""
        if instances < 2 or busy != instances - 1 or not self.running:
            return ()
        since = now - ACTIVE_S
        running = self.running
        waiting = any(at > since and tenant not in running for tenant, at in self.seen.items())
        return running if waiting else ()

    def bulk(self, requests: Mapping[str, int], now: float, backlogged: Callable[[str], bool]) -> bool:
        """Whether a batch holding ``requests`` (per tenant) goes to the bulk lane: another
        tenant was active lately, and every tenant of the batch has more than this one request
        in flight: two or more in the batch, or more queued behind it (``backlogged``). A
        tenant sending one request at a time never has, so its batches keep the full weight;
        so does everything while one tenant is active (tenancy then changes nothing)."""
        since = now - ACTIVE_S
        if not any(at > since and tenant not in requests for tenant, at in self.seen.items()):
            return False
        return all(count > 1 or backlogged(tenant) for tenant, count in requests.items())


def _front(queue: deque[Pending] | None, usable: Callable[[Pending], bool]) -> Pending | None:
    """The oldest request of ``queue`` that may run; those that left are popped on the way."""
    while queue:
        pending = queue[0]
        if pending.live and usable(pending):
            return pending
        if queue and queue[0] is pending:  # ``usable`` may have dropped it, popping it too
            queue.popleft()
    return None
