"""``ortserve_gc_pause_seconds``: how long each garbage collection stopped the process.

A collection holds the GIL for its whole run, so every thread, the event loop included, waits
it out: a generation-2 pass over a large heap is a latency spike no request metric explains.
``gc.callbacks`` is called at the start and the stop of every collection (in the thread that
triggered it); the pause is the time between, observed into an ortserve Histogram (one list
append, no lock: the GIL is held throughout a collection).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from ortserve.metrics import Histogram

__all__ = ["GC_PAUSE_BUCKETS", "GcPauses", "gc_pauses"]

GC_PAUSE_BUCKETS: tuple[float, ...] = (
    0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip
"""Seconds: a young-generation pass takes microseconds, a full one over a big heap, tens of ms."""
_GENERATIONS = 3


class GcPauses(Collector):
    """Times every collection by generation while installed.

    Args:
        clock: seconds, monotonic (injected: tests feed it).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._started: float | None = None
        self.pauses = [Histogram(GC_PAUSE_BUCKETS) for _ in range(_GENERATIONS)]

    def callback(self, phase: str, info: dict[str, int]) -> None:
        """``gc.callbacks`` entry: ``phase`` is "start" or "stop"."""
        if phase == "start":
            self._started = self._clock()
        elif self._started is not None:
            generation = min(max(info.get("generation", 0), 0), _GENERATIONS - 1)
            self.pauses[generation].observe(self._clock() - self._started)
            self._started = None

    def install(self) -> None:
        if self.callback not in gc.callbacks:
            gc.callbacks.append(self.callback)

    def uninstall(self) -> None:
        if self.callback in gc.callbacks:
            gc.callbacks.remove(self.callback)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            "ortserve_gc_pause_seconds",
            "Time each garbage collection held the process (the GIL), by generation",
            labels=["generation"],
        )
        for generation, histogram in enumerate(self.pauses):
            family.add_metric([str(generation)], histogram.cumulative(), histogram.sum)
        yield family


_PROCESS: GcPauses | None = None


def gc_pauses() -> GcPauses:
    """The process's one timer, installed on first use (every server in a process shares it)."""
    global _PROCESS
    if _PROCESS is None:
        _PROCESS = GcPauses()
        _PROCESS.install()
    return _PROCESS
