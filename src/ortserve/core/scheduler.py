"""The scheduler of one served version: admission, queueing, batching and running, coordinated.

The scheduler is driven by events, not by a polling task: a submission and a delay timer
call ``_dispatch`` on the event loop, and a worker that finishes a batch takes the next one
itself (:meth:`BatchJob.complete`), so the model never waits for a loop that is busy reading
sockets. The queue is shared between the loop and the workers under one lock; whatever must
happen on the loop (answering futures, timers, the observer) is handed back to it.

It coordinates: the queued and running work and the taking of batches are the
:class:`~ortserve.core.backlog.Backlog`'s, the admission arithmetic and its kept verdicts
the :class:`~ortserve.core.admission.Admission`'s, the refusals that read the tenants'
shares of the queue the :class:`~ortserve.core.tenant_admission.TenantAdmission`'s, a
batch's requests (joined, answered) :mod:`ortserve.core.batch`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections.abc import Callable
from functools import partial

import numpy as np
import numpy.typing as npt

from ortserve.core.admission import Admission, concurrency_limit
from ortserve.core.backlog import Backlog
from ortserve.core.batch import Pending, Run, assemble, fail, report
from ortserve.core.clock import Clock, TimerHandle
from ortserve.core.costmodel import BatchCostModel
from ortserve.core.inlining import InlineGate
from ortserve.core.job import BatchExecutor, BatchJob, Feeds, RunResult
from ortserve.core.observer import NullObserver, SchedulerObserver
from ortserve.core.policy import SchedulingPolicy
from ortserve.core.read_delay import read_delay_of
from ortserve.core.screening import BatchScreen, split_refused
from ortserve.core.tenant_admission import TenantAdmission
from ortserve.errors import DeadlineExceeded, InvalidInput, ModelNotReady, OrtServeError

__all__ = ["BatchExecutor", "Scheduler"]

# A loop that takes longer than this to come back to a callback is busy with other work
# (intake under overload): a batch run inline would wait for its turns on it (the dispatch,
# the settle), so batches go to the runner's thread, which takes the next one itself.
_LOOP_BEHIND_S = 0.010

Array = npt.NDArray[np.generic]


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
        self.concurrency = concurrency_limit(policy, executor.instances)
        # _lock guards the backlog (all of it), the cost model's and the concurrency limit's
        # learning, the inline gate and the admission's kept verdicts: the loop and the
        # workers both take batches and book their ends.
        self._lock = threading.Lock()
        self._backlog = Backlog(policy, self.cost_model, executor.instances)
        # How long requests sat unread before this loop's transports read them: admission
        # counts it in the wait, and a request's arrival is dated back by it.
        self._read_delay = read_delay_of(loop)
        self._admission = Admission(
            self._backlog, policy, self.cost_model, self.concurrency, clock, self._lock, self._read_delay
        )
        self._tenants = TenantAdmission(self._backlog, self._admission, policy, clock, self._lock)
        self._inline = InlineGate()
        self._tenancy = False  # a request named its tenant: the queue is shared by tenants
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
        return self._backlog.queued_requests

    @property
    def busy_instances(self) -> int:
        """Batches running now."""
        return self._backlog.busy

    @property
    def waiting_for_company(self) -> bool:
        """A free instance is holding the queue back on purpose (batching delay timer)."""
        return self._delay_timer is not None

    def submit(
        self,
        feeds: Feeds,
        rows: int,
        priority: int = 0,
        timeout_s: float | None = None,
        tenant: str | None = None,
    ) -> asyncio.Future[list[Array]]:
        """Admit a validated request; the future resolves to its own rows of every output.

        Args:
            feeds: input name -> array; dim 0 is the batch dimension when batching is on.
            rows: the request's size along dim 0 (1 when batching is off).
            priority: 0 for the default lane, else 1 (most urgent) .. priority_levels.
            timeout_s: time allowed from now; None uses the policy's default.
            tenant: who sent it, when tenancy is on: from then on the queue is shared fairly
                between tenants (:mod:`~ortserve.core.fairness`); None: tenancy off.

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
        pending = Pending(feeds, rows, signature, now - self._read_delay.unread_s, deadline, future, lane)
        backlog = self._backlog
        with self._lock:
            if tenant is not None or self._tenancy:
                self._tenancy = True
                error = self._tenants.refusal(pending, tenant, as_at_edge, now, deadline)
            elif as_at_edge and self._admission.still_admitted(lane):
                error = None  # the edge's verdict for this request (refusal()) still holds
            else:
                error = self._admission.refusal(now, rows, lane, deadline)
            if error is None:
                backlog.add(pending)
        if error is not None:
            self.observer.on_rejected(error)
            raise error
        if deadline is not None:
            pending.timer = self._clock.call_at(deadline, partial(self._expire, pending))
        self._idle.clear()
        if backlog.busy == 0 and not backlog.full_batch_queued():
            # Nothing runs: let the rest of this tick's requests join this one first. Starting
            # at once made one-row batches whenever the model had just gone idle under load.
            self._dispatch_at_tick_end_once()
        else:
            self._dispatch()
        return future

    def refusal(
        self, priority: int = 0, tenant_of: Callable[[], str | None] | None = None
    ) -> OrtServeError | None:
        """The refusal a one-row request would get now, or None; nothing is queued.

        The transports ask this with only the path and headers read, so that a request that
        will be refused costs no body decoding (issue 10: shed load at the edge). Under
        overload nearly every request asks, and the answer rarely changes between two changes
        of the queue: a refusal is kept, per lane, until the queue or the running batches
        change or until time alone could make it wrong, so refusing costs a lookup
        (:meth:`Admission.verdict`). The returned error may be shared by many requests:
        callers answer with it, never raise it (raising one instance again and again would
        chain its tracebacks).

        Returns:
            ModelNotReady (draining), InvalidInput (priority out of range), Overloaded (the
            queue, the concurrency limit, the queue-wait target or the budget refuses it).
            With tenancy on, a refusal of the kept (tenant-blind) verdict is checked against
            the request's tenant (``tenant_of``, asked only then): its share of the queue
            decides, as in ``submit``. Without ``tenant_of`` (gRPC) the blind verdict stands.
        """
        if self._closing:
            return ModelNotReady("model is shutting down")
        try:
            lane = self._lane_index(priority)
        except InvalidInput as invalid:
            return invalid
        error = self._admission.verdict(lane)
        if error is not None and tenant_of is not None and self._tenancy:
            tenant = tenant_of()
            if tenant is not None:
                error = self._tenants.verdict(lane, tenant, error)
        if error is not None:
            self.observer.on_rejected(error)
        return error

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

    # -- leaving the queue --------------------------------------------------------------
    def _expire(self, pending: Pending) -> None:
        with self._lock:
            if not pending.live:
                return
            self._backlog.remove(pending)
        if not pending.future.done():
            error = DeadlineExceeded("deadline passed while the request was queued")
            self.observer.on_rejected(error)
            pending.future.set_exception(error)
        self._after_loop_work()

    def _after_loop_work(self) -> None:
        """On the loop: answer what workers dropped, cancel stale timers, note idleness."""
        backlog = self._backlog
        with self._lock:
            dropped, backlog.dropped = backlog.dropped, []
            timers, backlog.stale_timers = backlog.stale_timers, []
        for timer in timers:
            timer.cancel()
        for pending, error in dropped:
            if not pending.future.done():
                self.observer.on_rejected(error)
                pending.future.set_exception(error)
        # Only where the state is settled, so a drain never sees a passing "idle" while a
        # batch is being handed over.
        if backlog.queued_requests == 0 and backlog.busy == 0:
            self._idle.set()

    # -- starting batches ---------------------------------------------------------------
    def _job(self, run: Run, expected_s: float, inline: bool) -> BatchJob | None:
        """Assemble the batch (outside the lock: concatenation takes a while) and screen it.

        The screen checks the assembled batch once: its NumPy calls cost the same for one row
        as for 32, so a check per request cost a small model more than its share of the run.
        A batch it cannot prove fine loses the requests that break a limit (answered 400 when
        the run settles) and runs with the others; a batch that loses all is settled unrun
        (None: nothing to execute).
        """
        started = self._clock.now()
        feeds = assemble(run.batch)
        if self._screen is not None and not self._screen.passes(feeds):
            if not self._screen_out(run, self._screen):
                with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
                    self._loop.call_soon_threadsafe(partial(self._settle, run, None, None, True))
                return None
            feeds = assemble(run.batch)
        run.assemble_s = self._clock.now() - started
        return BatchJob(feeds, expected_s, inline, partial(self._complete, run), run.bulk)

    def _screen_out(self, run: Run, screen: BatchScreen) -> bool:
        """Move the requests the screen refuses to ``run.refused``; False when none is left."""
        served, refused = split_refused(screen, run.batch)
        if refused:
            wait_of = dict(zip(map(id, run.batch), run.waits, strict=True))
            rows = sum(p.rows for p in served)
            run.batch, run.refused = served, refused
            left, run.rows = run.rows - rows, rows
            run.waits = tuple(wait_of[id(p)] for p in served)
            with self._lock:
                self._backlog.screened_out(len(refused), left)
        return bool(served)

    # -- dispatch on the loop -----------------------------------------------------------
    def _dispatch(self, timer_fired: bool = False) -> None:
        backlog = self._backlog
        while True:
            now = self._clock.now()
            with self._lock:
                alone = backlog.busy == 0
                batch, when = backlog.take_ready(now, timer_fired)
                booked = backlog.begin(batch, now) if batch else None
                inline = booked is not None and alone and self._runs_inline(*booked)
            timer_fired = False
            if booked is None:
                if when < math.inf:
                    self._arm_delay(when)
                self._after_loop_work()
                return
            run, expected_s = booked
            self._start(run, expected_s, inline)

    def _runs_inline(self, run: Run, expected_s: float) -> bool:
        """Whether the loop runs this batch itself (under the lock; see :class:`InlineGate`):
        never while the loop is behind (a 3,000-connection flood ran 44 inline batches in 10 s,
        each waiting ~70 ms ticks to be dispatched and then settled)."""
        if self._loop_lag_s > _LOOP_BEHIND_S:
            return False
        return self._inline.allows(run.rows, expected_s, self._executor.inline_below_s)

    def _start(self, run: Run, expected_s: float, inline: bool) -> None:
        try:
            job = self._job(run, expected_s, inline)
            if job is not None:
                self._executor.execute(job)
        except Exception as exc:  # the executor could not even start: fail this batch only
            with self._lock:
                self._backlog.unbook(run)
            fail(run.batch, exc)

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
        self, run: Run, result: RunResult | None, error: BaseException | None, chain: bool
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
        backlog = self._backlog
        with self._lock:
            self._release(run, result)
            if backlog.loop_is_behind(now):
                batch = backlog.take_ready(now, False)[0]
                booked = backlog.begin(batch, now) if batch else None
        following = self._job(booked[0], booked[1], False) if booked is not None else None
        with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
            self._loop.call_soon_threadsafe(partial(self._settle, run, result, error, False))
        return following

    def _release(self, run: Run, result: RunResult | None) -> None:
        """Free the run's instance and learn from its time (under the lock)."""
        self._backlog.unbook(run)
        if result is not None:
            self._backlog.served(run, self._clock.now())
            self.cost_model.observe(run.rows, result[1])
            self._inline.observe(run.rows, result[1])
            if self._policy.adaptive_concurrency and self.concurrency is not None:
                now = self._clock.now()
                for pending in run.batch:
                    self.concurrency.observe(now - pending.arrival)

    def _settle(self, run: Run, result: RunResult | None, error: BaseException | None, release: bool) -> None:
        """On the loop: answer the batch's requests, report it, dispatch what is waiting."""
        if release:
            with self._lock:
                self._release(run, result)
        for pending, refusal in run.refused:
            if not pending.future.done():
                pending.future.set_exception(refusal)
        if run.batch:
            report(run, result, error, self._clock, self.observer)
        if self._backlog.full_batch_queued():
            self._dispatch()
        elif self._backlog.queued_requests:
            self._dispatch_at_tick_end_once()
        else:
            self._after_loop_work()  # nothing waits: no dispatch to schedule

    # -- lifecycle ----------------------------------------------------------------------
    async def drain(self, timeout_s: float) -> bool:
        """Refuse new work and wait for queued and running requests; True if all finished."""
        self._closing = True
        backlog = self._backlog
        try:
            async with asyncio.timeout(timeout_s):
                while backlog.queued_requests or backlog.busy:
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
            self._backlog.drop_all(reason)
        self._after_loop_work()
