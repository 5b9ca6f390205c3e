"""What the scheduler reports: one record per execution, one call per refused request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ortserve.errors import OrtServeError

__all__ = ["BatchRecord", "NullObserver", "SchedulerObserver", "make_observer_chain"]


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """What one execution did, for metrics and statistics."""

    requests: int
    rows: int
    queue_waits_s: tuple[float, ...]
    assemble_s: float
    run_s: float
    split_s: float
    failed: bool


class SchedulerObserver(Protocol):
    """Receives one record per execution and one call per request refused or expired."""

    def on_batch(self, record: BatchRecord) -> None: ...

    def on_rejected(self, error: OrtServeError) -> None: ...


class NullObserver:
    """Records nothing (the default)."""

    def on_batch(self, record: BatchRecord) -> None:
        pass

    def on_rejected(self, error: OrtServeError) -> None:
        pass


def make_observer_chain(*observers: SchedulerObserver) -> SchedulerObserver:
    """One observer that forwards to several (metrics and statistics side by side)."""
    return _Chain(observers)


class _Chain:
    def __init__(self, observers: Sequence[SchedulerObserver]) -> None:
        self._observers = tuple(observers)

    def on_batch(self, record: BatchRecord) -> None:
        for observer in self._observers:
            observer.on_batch(record)

    def on_rejected(self, error: OrtServeError) -> None:
        for observer in self._observers:
            observer.on_rejected(error)
