"""Model control modes: when the repository is looked at again, and which versions are complete.

``none``: loaded once at start; SIGHUP re-scans. ``poll``: re-scanned every poll period and on
SIGHUP. ``explicit``: only the control API loads and unloads (SIGHUP is logged and ignored).

A version folder found by a re-scan counts as complete when the copier wrote the marker
:data:`~ortserve.repository.snapshot.COMPLETE_MARKER` into it after every other file (the
default, ``--require-complete-marker``): files that merely stopped changing are not enough, as a
writer that preallocates the final size (``posix_fallocate``, rsync ``--preallocate``, aria2)
and stalls mid-copy leaves a folder of the right sizes, unchanged between looks, holding zeros;
served, it answered zeros and the ``latest`` policy retired the good version. With
``--no-require-complete-marker`` a folder whose files (names, sizes, mtimes) are unchanged
between two observations counts too. In poll mode the observations are one poll period apart;
after a SIGHUP in ``none`` mode the watcher looks again every ``settle_s`` until nothing is still
changing. What is in the repository at start is loaded as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Literal, cast

from ortserve.repository.manager import LifecycleManager
from ortserve.repository.snapshot import Fingerprint, ModelSnapshot, VersionSnapshot, snapshot_repository

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
        require_marker: only a version with the completion marker is complete (None: the
            server's ``require_complete_marker`` setting).
    """

    def __init__(
        self,
        manager: LifecycleManager,
        mode: ControlMode,
        poll_s: float,
        settle_s: float = SETTLE_S,
        require_marker: bool | None = None,
    ) -> None:
        self._manager = manager
        self._require_marker = (
            manager.settings.require_complete_marker if require_marker is None else require_marker
        )
        self._mode = mode
        self._poll_s = poll_s
        self._settle_s = settle_s
        self._wake = asyncio.Event()
        self._previous: dict[str, ModelSnapshot] = {}
        self._accepted: dict[tuple[str, int], Fingerprint] = {}
        """The files of each version as they were when found complete (or loaded at start):
        they stay complete while unchanged, with or without a marker."""

    def seed(self, snapshots: list[ModelSnapshot]) -> None:
        """The first observation (what the server loaded at start, complete as it was)."""
        self._previous = {s.name: s for s in snapshots}
        self._accepted = {(s.name, n): v.files for s in snapshots for n, v in s.versions.items()}

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
                n for n, v in snapshot.versions.items() if self._complete(snapshot.name, n, v, previous)
            }
            for number in complete:
                self._accepted[(snapshot.name, number)] = snapshot.versions[number].files
            config_settled = previous is not None and previous.config == snapshot.config
            changing = any(
                not self._settled(previous, n, v) for n, v in snapshot.versions.items() if n not in complete
            )
            if changing or not config_settled:
                settling = True
            if config_settled:
                await self._manager.sync(snapshot, complete)
        self._previous = current
        return settling

    def _complete(
        self, model: str, number: int, version: VersionSnapshot, previous: ModelSnapshot | None
    ) -> bool:
        if version.marked or self._accepted.get((model, number)) == version.files:
            return True
        return not self._require_marker and self._settled(previous, number, version)

    @staticmethod
    def _settled(previous: ModelSnapshot | None, number: int, version: VersionSnapshot) -> bool:
        """Unchanged since the last look (the weaker sign, without the marker)."""
        return previous is not None and previous.versions.get(number) == version
