"""Waiting in tests for what another thread, task or process does: the one poller.

A test that sleeps a fixed time and then checks guesses how long the other side takes: too
short and it fails on a busy machine, too long and every run pays for it. These wait for the
condition itself, checking it every few milliseconds up to a generous limit, and fail naming
what never came. Prefer a real event where the code under test offers one (a future, a
socket read that blocks until the server answers, ``process.wait()``); these are for state
that has no hook, such as a counter another thread bumps or a page another process serves.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["until", "wait_until"]

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T | None],
    timeout_s: float = 30.0,
    what: str = "the condition",
    tolerate: tuple[type[BaseException], ...] = (),
    poll_s: float = 0.05,
) -> T:
    """Call ``condition`` until it returns something truthy, and return that.

    Args:
        condition: what is awaited; usually reads another thread's or process's state.
        timeout_s: when to give up (an AssertionError naming ``what``).
        what: the condition in words, for the failure.
        tolerate: errors that mean "not yet" (a server still starting refuses connections).
        poll_s: the pause between checks; checks that ask a server over a socket cost it work.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            found: T | None = condition()
        except tolerate:
            found = None
        if found:
            return found
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not met within {timeout_s} s")
        time.sleep(poll_s)


async def until(
    condition: Callable[[], T | None],
    timeout_s: float = 10.0,
    what: str = "the condition",
    poll_s: float = 0.01,
) -> T:
    """:func:`wait_until` for a test on the event loop: the loop runs between the checks."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not (found := condition()):
        if loop.time() >= deadline:
            raise AssertionError(f"{what} not met within {timeout_s} s")
        await asyncio.sleep(poll_s)
    return found
