"""Monotonic time and timers for the scheduler, injectable so tests never sleep."""

from __future__ import annotations

import asyncio
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
    """The running event loop's monotonic clock and timers."""

    __slots__ = ("_loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def now(self) -> float:
        return self._loop.time()

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        return self._loop.call_at(when, callback)
