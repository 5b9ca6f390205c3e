"""Whether a batch runs on the event loop's thread or on a worker: a robust, stable choice."""

from __future__ import annotations

from collections import deque

__all__ = ["InlineGate"]

_WINDOW = 15
"""Run times kept per size class; the median of 15 ignores up to 7 preempted runs."""
_MIN_SAMPLES = 5
"""Below this the class has no median of its own yet and the caller's prediction decides."""
_BAND = 1.25
"""Hysteresis: an inline class leaves above ``limit * 1.25``, a worker class joins below
``limit / 1.25``, so a median that wanders about the limit does not flip the path per batch."""
_CLASSES = 17


class InlineGate:
    """Decides per batch-size class (1, 2-3, 4-7, ... rows) from the median of its recent runs.

    The cost model's mean (``a + b * rows``) is the right figure for queue-wait estimates,
    but a poor one for this choice: run times are heavy-tailed (one run preempted for a
    scheduler slice of milliseconds adds tens of microseconds to a mean of 30 us runs), so a
    small model's one-row prediction wandered about the 100 us limit with the machine's
    noise, and two identical models in one server ended up on different paths (one inline,
    one paying two thread switches and a loop wake-up per batch) depending on their warm-up.
    The median of the last runs of the same size class is what a typical run costs, whichever
    thread ran it; hysteresis keeps a class on its path until its median clearly crosses.

    Not thread-safe: the scheduler calls it under its lock.
    """

    __slots__ = ("_inline", "_medians", "_runs")

    def __init__(self) -> None:
        self._runs: list[deque[float]] = [deque(maxlen=_WINDOW) for _ in range(_CLASSES)]
        self._medians: list[float | None] = [None] * _CLASSES
        self._inline: list[bool | None] = [None] * _CLASSES

    def observe(self, rows: int, seconds: float) -> None:
        """Fold in one measured run of a batch of ``rows`` rows."""
        index = _size_class(rows)
        runs = self._runs[index]
        runs.append(seconds)
        if len(runs) >= _MIN_SAMPLES:
            self._medians[index] = sorted(runs)[len(runs) // 2]

    def median_s(self, rows: int) -> float | None:
        """The median recent run time of batches of this size class (None: too few runs)."""
        return self._medians[_size_class(rows)]

    def allows(self, rows: int, predicted_s: float, limit_s: float) -> bool:
        """Whether a batch of ``rows`` rows should run inline, given the limit of the runner.

        Args:
            rows: the batch's rows.
            predicted_s: the cost model's prediction, used until the class has its own runs.
            limit_s: the runner's ``inline_below_s`` (0: never inline).
        """
        if limit_s <= 0.0:
            return False
        index = _size_class(rows)
        median = self._medians[index]
        if median is None:
            return predicted_s < limit_s
        was = self._inline[index]
        if was is None:
            now = median < limit_s
        elif was:
            now = median < limit_s * _BAND
        else:
            now = median < limit_s / _BAND
        self._inline[index] = now
        return now


def _size_class(rows: int) -> int:
    return min(max(rows, 1).bit_length() - 1, _CLASSES - 1)
