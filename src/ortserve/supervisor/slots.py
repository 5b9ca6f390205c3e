"""The worker processes: start each, restart one that dies (with backoff), signal them all."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time

from ortserve.supervisor.spawner import Spawner, WorkerProcess, ZygoteError

__all__ = ["STARTUP_FAILED", "WorkerSlot"]

logger = logging.getLogger(__name__)

STARTUP_FAILED = 1
"""A worker's exit code when it cannot start (a bad repository, say): restarting cannot help."""
_FIRST_BACKOFF_S = 0.5
_MAX_BACKOFF_S = 30.0
_STABLE_S = 30.0
"""A worker that lived this long starts the backoff over when it dies."""


class WorkerSlot:
    """One worker process, kept running until the supervisor stops.

    A worker that dies is started again after a pause that doubles with each quick death
    (0.5 s up to 30 s), so a crash loop neither spins the CPU nor stops retrying; each restart
    is logged and counted.

    Args:
        index: the worker's number (its private socket is named after it).
        spawner: forks the worker (from the zygote).
    """

    def __init__(self, index: int, spawner: Spawner) -> None:
        self.index = index
        self.restarts = 0
        self.process: WorkerProcess | None = None
        self.failed_start: int | None = None
        """Set when the first start failed with STARTUP_FAILED: the supervisor gives up."""
        self._spawner = spawner
        self._stopping = asyncio.Event()
        self._stop_signal: int | None = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None or self.process.returncode is not None else self.process.pid

    async def run(self) -> None:
        """Keep the worker running until :meth:`stop`; returns once the last one has exited."""
        backoff = _FIRST_BACKOFF_S
        while True:
            born = time.monotonic()
            try:
                self.process = await self._spawner.start(self.index, restarted=self.restarts > 0)
            except ZygoteError as exc:
                self.process = None
                if self.restarts == 0:
                    self.failed_start = STARTUP_FAILED
                    logger.error("worker %d could not start: %s", self.index, exc)
                    return
                code, what = STARTUP_FAILED, str(exc)
            else:
                if self._stop_signal is not None:  # asked to stop while it was being forked
                    self.process.send_signal(self._stop_signal)
                code = await self.process.wait()
                what = f"pid {self.process.pid}"
            if self._stopping.is_set():
                logger.info("worker %d (%s) exited with %d", self.index, what, code)
                return
            if code == STARTUP_FAILED and self.restarts == 0:
                self.failed_start = code
                logger.error("worker %d could not start (exit code %d)", self.index, code)
                return
            if time.monotonic() - born > _STABLE_S:
                backoff = _FIRST_BACKOFF_S
            self.restarts += 1
            logger.warning(
                "worker %d (%s) died (%s); restart %d in %.1f s",
                self.index,
                what,
                _describe(code),
                self.restarts,
                backoff,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), backoff)
            if self._stopping.is_set():
                return
            backoff = min(backoff * 2, _MAX_BACKOFF_S)

    def signal(self, number: int) -> None:
        """Pass ``number`` on to the worker, if it runs."""
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(number)

    def stop(self, number: int) -> None:
        """No more restarts; pass ``number`` (SIGTERM: delay and drain; SIGINT: drain) on."""
        self._stopping.set()
        self._stop_signal = number
        self.signal(number)

    def kill(self) -> None:
        self._stopping.set()
        self.signal(signal.SIGKILL)


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
