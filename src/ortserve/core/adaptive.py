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

__all__ = ["AdaptiveLimit", "ServiceMeter"]

_WINDOW = 50
"""Latency samples per update."""
_TOLERANCE = 1.5
"""Latency up to this multiple of the no-load figure counts as no queueing (batching itself
adds a batch's time)."""
_SMOOTHING = 0.2
"""Weight of a new decrease (increases apply at once: growth is already only sqrt(limit))."""
_SERVICE_WEIGHT = 0.1
"""Weight of one batch in the measured service slowdown (about the last 10-20 batches)."""
_MAX_SLOWDOWN = 16.0
"""The slowdown is believed up to this (a stall of the whole process is not service)."""


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


class ServiceMeter:
    """How much slower than its predicted run time the runner really serves a batch: the
    measured service rate that the automatic queue-wait target is counted in.

    The cost model predicts a batch's run alone; the runner's real turnaround also holds the
    gap before the next batch starts (the loop reading, dispatching and answering), and on a
    busy machine both stretch. A target in predicted seconds then compares a real queueing
    wait against a service time that is too short, and a load that is merely slower gets
    refused and shed (issue 30: 64 connections on a busy machine got 429s from heavy_mlp's
    batch of 32). Counting the target in measured service time means that a queueing delay
    refuses only when it grows faster than the service itself: the gradient of
    concurrency-limits and Envoy's adaptive concurrency, with service in the place of their
    no-load latency.

    One batch's service time is from the previous batch's end to its own, counted only when
    its oldest request was already waiting then (a runner left idle by an empty queue is not
    slow service). With several instances their batches overlap; a batch started before the
    previous end is timed from its own start.
    """

    __slots__ = ("_last_end", "slowdown")

    def __init__(self) -> None:
        self.slowdown = 1.0
        """Measured service time over predicted run time, at least 1 (smoothed)."""
        self._last_end = -math.inf

    def observe(self, started: float, oldest_arrival: float, end: float, predicted_s: float) -> None:
        """One batch booked at ``started`` ended at ``end``; it was predicted ``predicted_s``."""
        origin = self._last_end if self._last_end <= started else started
        served = end - origin
        self._last_end = max(self._last_end, end)
        if predicted_s <= 0 or served <= 0 or oldest_arrival > origin:
            return
        ratio = min(_MAX_SLOWDOWN, max(1.0, served / predicted_s))
        self.slowdown += _SERVICE_WEIGHT * (ratio - self.slowdown)
