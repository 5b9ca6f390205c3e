"""Giving the heap pages that large request bodies leave behind back to the operating system.

A body arrives as many reads of up to 256 KiB; once joined, answered or dropped, its pieces
are free but glibc keeps the pages in its heap (only the top of the heap is trimmed), so the
process's resident memory stays at its high-water mark: measured +264 MiB after a burst of
near-limit bodies, and the joined copies came on top of pages still held for the pieces.
``malloc_trim(0)`` returns every free page; it costs about 0.15 ms per MiB released, so it
runs in a worker thread (ctypes releases the GIL), one at a time, after enough was freed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ortserve.core.heap import malloc_trim

__all__ = ["HeapTrimmer", "malloc_trim"]


class HeapTrimmer:
    """Trims the heap in a worker thread once ``threshold`` bytes were freed since the last trim.

    Args:
        trim: what trims (glibc's ``malloc_trim``; None on other C libraries: a no-op).
        threshold: bytes freed that make a trim worth it.
    """

    def __init__(self, trim: Callable[[], None] | None = malloc_trim, threshold: int = 8 << 20) -> None:
        self._trim = trim
        self._threshold = threshold
        self._freed = 0
        self._running: asyncio.Future[None] | None = None

    def freed(self, size: int) -> None:
        """``size`` bytes of request data were just released."""
        self._freed += size
        if self._trim is not None and self._running is None and self._freed >= self._threshold:
            self._freed = 0
            self._running = asyncio.get_running_loop().run_in_executor(None, self._trim)
            self._running.add_done_callback(self._done)

    def _done(self, future: asyncio.Future[None]) -> None:
        self._running = None
        if future.cancelled():
            return
        future.exception()  # glibc's trim does not fail; retrieved so nothing is left unread
        self.freed(0)  # what was freed meanwhile
