"""The heap trimmer: runs once enough was freed, in a worker thread, one trim at a time."""

from __future__ import annotations

import asyncio
import threading

from ortserve.server.memory import HeapTrimmer, malloc_trim


async def test_a_trim_runs_off_the_loop_once_enough_was_freed_and_catches_up_after() -> None:
    loop_thread = threading.get_ident()
    started: list[int] = []
    release = threading.Event()

    def trim() -> None:
        started.append(threading.get_ident())
        release.wait(5)

    trimmer = HeapTrimmer(trim, threshold=100)
    trimmer.freed(60)
    await asyncio.sleep(0.05)
    assert started == []  # not enough freed yet
    trimmer.freed(60)
    trimmer.freed(500)  # while the first trim runs: no second one at once
    await asyncio.sleep(0.05)
    assert len(started) == 1 and started[0] != loop_thread
    release.set()
    for _ in range(100):
        if len(started) == 2:
            break
        await asyncio.sleep(0.01)
    assert len(started) == 2  # what was freed meanwhile gets its own trim


def test_glibc_is_found_here() -> None:
    assert malloc_trim is not None  # the container runs glibc; elsewhere trimming is a no-op
