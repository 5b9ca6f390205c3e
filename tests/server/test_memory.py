"""The heap trimmer: runs once enough was freed, in a worker thread, one trim at a time."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from ortserve.server.memory import HeapTrimmer, malloc_trim

T = TypeVar("T")


class CountingExecutor(ThreadPoolExecutor):
    """The loop's default executor, counting the trims handed to it (a trim is scheduled at once
    by ``freed``, so the count says what was scheduled without waiting for threads)."""

    def __init__(self, trim: Callable[[], None]) -> None:
        super().__init__(max_workers=2)
        self.trim = trim
        self.trims = 0

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        self.trims += fn is self.trim
        return super().submit(fn, *args, **kwargs)


async def test_a_trim_runs_off_the_loop_once_enough_was_freed_and_catches_up_after() -> None:
    loop = asyncio.get_running_loop()
    loop_thread = threading.get_ident()
    started: asyncio.Queue[int] = asyncio.Queue()
    release = threading.Event()

    def trim() -> None:
        loop.call_soon_threadsafe(started.put_nowait, threading.get_ident())
        release.wait(5)

    executor = CountingExecutor(trim)
    loop.set_default_executor(executor)
    trimmer = HeapTrimmer(trim, threshold=100)
    trimmer.freed(60)
    assert executor.trims == 0  # not enough freed yet
    trimmer.freed(60)
    trimmer.freed(500)  # while the first trim runs: no second one at once
    assert executor.trims == 1
    assert await asyncio.wait_for(started.get(), 5) != loop_thread
    assert executor.trims == 1
    release.set()
    await asyncio.wait_for(started.get(), 5)  # what was freed meanwhile gets its own trim
    assert executor.trims == 2


def test_glibc_is_found_here() -> None:
    assert malloc_trim is not None  # the container runs glibc; elsewhere trimming is a no-op
