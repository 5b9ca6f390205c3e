"""Model control modes: when the repository is looked at again, and which versions are complete.

``none``: loaded once at start; SIGHUP re-scans. ``poll``: re-scanned every poll period and on
SIGHUP. ``explicit``: only the control API loads and unloads (SIGHUP is logged and ignored).

A version folder counts as complete when its files (names, sizes, mtimes) are unchanged
between two observations, or when the copier wrote the marker
:data:`~ortserve.repository.snapshot.COMPLETE_MARKER` into it. In poll mode the observations
are one poll period apart (a new version serves within two periods); after a SIGHUP in
``none`` mode the watcher looks again every ``settle_s`` until nothing is still changing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Literal, cast

from ortserve.repository.manager import LifecycleManager
from ortserve.repository.snapshot import ModelSnapshot, snapshot_repository

__all__ = ["ControlMode", "RepositoryWatcher", "control_mode"]

logger = logging.getLogger(__name__)

ControlMode = Literal["none", "poll", "explicit"]
SETTLE_S = 1.0


def control_mode(text: str) -> ControlMode:
    """Raises: ValueError for anything but none, poll or explicit."""
    if text in ("none", "poll", "explicit"):
        return cast(ControlMode, text)
    raise ValueError(f"model control mode {text!r} is not none, poll or explicit")


class RepositoryWatcher:
    """Re-scans the repository for the manager (poll timer, SIGHUP).

    Args:
        manager: applies what a scan finds.
        mode: the model control mode.
        poll_s: poll period (poll mode).
        settle_s: delay between observations while a folder is still changing (none mode).
    """

    def __init__(
        self, manager: LifecycleManager, mode: ControlMode, poll_s: float, settle_s: float = SETTLE_S
    ) -> None:
        self._manager = manager
        self._mode = mode
        self._poll_s = poll_s
        self._settle_s = settle_s
        self._wake = asyncio.Event()
        self._previous: dict[str, ModelSnapshot] = {}

    def seed(self, snapshots: list[ModelSnapshot]) -> None:
        """The first observation (what the server loaded at start)."""
        self._previous = {s.name: s for s in snapshots}

    def rescan_soon(self) -> None:
        """SIGHUP: look at the repository now (explicit mode: logged, nothing else)."""
        if self._mode == "explicit":
            logger.warning("SIGHUP ignored: the model control mode is explicit (use the repository API)")
            return
        logger.info("SIGHUP: re-scanning the model repository")
        self._wake.set()

    async def run(self) -> None:
        """Wait for the poll timer or SIGHUP and scan, until cancelled (the server owns the task)."""
        settling = False
        while True:
            timeout = self._poll_s if self._mode == "poll" else (self._settle_s if settling else None)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            self._wake.clear()
            if self._mode == "explicit":
                continue
            try:
                settling = await self.scan()
            except Exception:  # a failed scan must not end the watcher; the next one retries
                logger.exception("re-scanning the model repository failed")

    async def scan(self) -> bool:
        """Observe the repository once and sync every model; True while some folder changes."""
        snapshots = await asyncio.to_thread(snapshot_repository, self._manager.settings.model_repository)
        current = {s.name: s for s in snapshots}
        settling = False
        for name in sorted(set(self._previous) - set(current)):
            if self._manager.registry.find(name) is not None:
                logger.info("model %s: its folder was removed", name)
                await self._manager.remove(name)
        for snapshot in snapshots:
            previous = self._previous.get(snapshot.name)
            complete = {
                number
                for number, version in snapshot.versions.items()
                if version.marked or (previous is not None and previous.versions.get(number) == version)
            }
            config_settled = previous is not None and previous.config == snapshot.config
            if len(complete) < len(snapshot.versions) or not config_settled:
                settling = True
            if config_settled:
                await self._manager.sync(snapshot, complete)
        self._previous = current
        return settling
