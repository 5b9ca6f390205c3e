"""Monotonic time and timers for the scheduler, injectable so tests never sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Clock", "LoopClock", "TimerHandle"]


class TimerHandle(Protocol):
    """A scheduled callback that can be called off."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    """Where the scheduler reads the time and sets timers (seconds, monotonic)."""

    def now(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle: ...


class LoopClock:
    """``time.monotonic`` for readings, the event loop for timers.

    uvloop's ``loop.time()`` only advances in whole milliseconds, once per loop iteration:
    too coarse for sub-millisecond queue waits and a 1 ms batching delay. Timers are set
    relative to the precise clock and handed to the loop as delays.
    """

    __slots__ = ("_loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def now(self) -> float:
        return time.monotonic()

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        return self._loop.call_later(max(0.0, when - time.monotonic()), callback)
