"""A served version's resilience: its input sandbox, fallback chain, probing and readiness."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import numpy as np
import numpy.typing as npt

from ortserve.core.clock import Clock, TimerHandle
from ortserve.core.sandbox import InputSandbox
from ortserve.core.types import Parameters
from ortserve.errors import ModelNotReady
from ortserve.resilience.chain import FallbackChain

__all__ = ["ResilienceGuard"]

logger = logging.getLogger(__name__)

Array = npt.NDArray[np.generic]


class ResilienceGuard:
    """What a ServedVersion asks before admitting a request and when reporting its health.

    Probing: when a breaker opens, the guard sets a timer (on the version's clock) for the
    probe's due time and runs the probe in a thread it owns; the next probe is scheduled when
    it ends, so a level recovers even while no traffic arrives (a version kept unready gets
    none). :meth:`close` cancels both.

    Args:
        chain: the fallback chain, or None (sandbox only).
        sandbox: the input sandbox, or None.
        ready_when_degraded: report ready while answering from a fallback level.
    """

    def __init__(
        self, chain: FallbackChain | None, sandbox: InputSandbox | None, ready_when_degraded: bool = True
    ) -> None:
        self.chain = chain
        self.sandbox = sandbox
        self.ready_when_degraded = ready_when_degraded
        self.primary = None if chain is None else chain.breakers[0]
        """Level 0's breaker. While it allows, the version is usable and ready: the served
        version reads it for every request and asks the guard only when it does not."""
        self.shapes = sandbox if sandbox is not None and sandbox.limits_shapes else None
        """The sandbox when it limits shapes (checked per request, before queueing), else None.
        Its value limits are checked once per assembled batch, by the scheduler
        (``Scheduler(screen=guard.sandbox)``): per request they cost more than a small
        model's share of its batch run."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clock: Clock | None = None
        self._timer: TimerHandle | None = None
        self._probing: asyncio.Future[None] | None = None
        self._closed = False

    def start(self, loop: asyncio.AbstractEventLoop, clock: Clock) -> None:
        """Arm the chain (warm-up is over) and begin watching its breakers."""
        self._loop = loop
        self._clock = clock
        if self.chain is not None:
            self.chain.on_open = self._breaker_opened
            self.chain.armed = True
            self._schedule()

    # -- admission and readiness -----------------------------------------------------
    def check_usable(self) -> None:
        """Raises ModelNotReady (503, with the reason) when no level can answer now."""
        primary = self.primary
        if primary is not None and not primary.allows:
            self._check_levels()

    def _check_levels(self) -> None:
        """Level 0 is open: raise unless a later level can answer."""
        chain = self.chain
        assert chain is not None
        if chain.current_level() is None:
            _, reason = chain.status()
            raise ModelNotReady(f"{chain.label} has no usable execution level: {reason}")

    @property
    def ready(self) -> bool:
        """Whether the version may be reported ready (level 0's breaker alone answers while
        it allows)."""
        primary = self.primary
        if primary is None or primary.allows:
            return True
        assert self.chain is not None
        level = self.chain.current_level()
        if level is None:
            return False
        return level == 0 or self.ready_when_degraded

    def parameters(self) -> Parameters:
        """The fallback level and its reason, for model metadata and the index."""
        if self.chain is None:
            return {}
        level, reason = self.chain.status()
        found: Parameters = {"fallback_level": -1 if level is None else level}
        if reason:
            found["fallback_reason"] = reason
        return found

    # -- probing ------------------------------------------------------------------------
    def _breaker_opened(self) -> None:
        """Called on a worker thread: reschedule on the loop."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
                loop.call_soon_threadsafe(self._schedule)

    def _schedule(self) -> None:
        if self._closed or self.chain is None or self._clock is None or self._probing is not None:
            return
        due = self.chain.next_probe_at()
        if due is None:
            return
        if self._timer is not None:
            self._timer.cancel()
        # The breakers read the same monotonic time as the version's clock (a fake one in tests).
        self._timer = self._clock.call_at(due, self._probe)

    def _probe(self) -> None:
        self._timer = None
        if self._closed or self.chain is None or self._loop is None:
            return
        self._probing = asyncio.ensure_future(asyncio.to_thread(self.chain.probe), loop=self._loop)
        self._probing.add_done_callback(self._probed)

    def _probed(self, done: asyncio.Future[None]) -> None:
        self._probing = None
        if not done.cancelled() and (error := done.exception()) is not None:
            logger.error("probing failed", exc_info=error)
        self._schedule()

    async def close(self) -> None:
        """Stop probing (unload); waits for a probe in progress. Also unhooks the chain's
        ``on_open`` (a bound method of this guard: a reference cycle), so the version goes
        with its last reference; startup versions are frozen out of the collector."""
        self._closed = True
        if self.chain is not None:
            self.chain.on_open = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        probing = self._probing
        if probing is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await probing
