"""An adaptive concurrency limit: how many requests one served version may hold, learnt from
the latency its requests see (``batching.concurrency: adaptive``).

The queue-wait target bounds queueing by the *predicted* cost of the work ahead; it is only as
good as the cost model. This limit needs no model of the work: it compares the latency
requests see now with the latency they see when nothing queues, the gradient of Netflix's
concurrency-limits and of TCP Vegas. While the two agree the limit grows (by about its square
root per window, so the queue it allows stays small); when latency rises above the no-load
figure the limit shrinks in proportion, which sheds load before the queue grows rather than
after. The no-load latency is the fastest request seen, except that a window served at the
minimum limit (where little can queue) re-teaches it, so a model or machine that became
slower for good is learnt again instead of being taken for congestion forever.
"""

from __future__ import annotations

import math

__all__ = ["AdaptiveLimit"]

_WINDOW = 50
"""Latency samples per update."""
_TOLERANCE = 1.5
"""Latency up to this multiple of the no-load figure counts as no queueing (batching itself
adds a batch's time)."""
_SMOOTHING = 0.2
"""Weight of a new decrease (increases apply at once: growth is already only sqrt(limit))."""


class AdaptiveLimit:
    """The limit on requests held (queued and running) for one served version.

    Args:
        initial: the starting limit.
        minimum: never below this (enough to fill a batch, say).
        maximum: never above this (the queue bound plus what can run at once).
    """

    def __init__(self, initial: int, minimum: int, maximum: int) -> None:
        self.minimum = max(1, minimum)
        self.maximum = max(self.minimum, maximum)
        self._limit = float(min(max(initial, self.minimum), self.maximum))
        self.no_load_s = math.inf
        self._window: list[float] = []

    @property
    def limit(self) -> int:
        return int(self._limit)

    def observe(self, latency_s: float) -> None:
        """One request's time from admission to its answer."""
        self._window.append(latency_s)
        if len(self._window) >= _WINDOW:
            self._update()

    def _update(self) -> None:
        window = sorted(self._window)
        self._window.clear()
        seen = window[len(window) // 2]  # the median: one slow request is not congestion
        if seen <= 0:
            return
        if self.no_load_s == math.inf or self.limit <= self.minimum:
            self.no_load_s = window[0]
        else:
            self.no_load_s = min(window[0], self.no_load_s)
        gradient = max(0.5, min(1.0, _TOLERANCE * self.no_load_s / seen))
        target = self._limit * gradient + math.sqrt(self._limit)
        if target < self._limit:
            target = (1 - _SMOOTHING) * self._limit + _SMOOTHING * target
        self._limit = min(max(target, self.minimum), self.maximum)
