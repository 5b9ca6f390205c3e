"""The queueing rules of one served version, as the scheduler reads them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SchedulingPolicy", "StandingQueue", "queue_wait_target"]

AUTO_WAIT_BATCHES = 2
"""Automatic queue-wait target: this many full batches of work ahead of a request (one to
start when the running batch ends, one as margin for the prediction), so an admitted request
waits at most about three batches where a saturated closed loop waits two. Measured side by
side (benchmarks/ab_queue_wait.py): 4 batches doubled heavy_mlp's admitted p99 at 4x
overload for no gain in goodput there ..."""
AUTO_WAIT_FLOOR_S = 0.05
"""... but never less than this (a burst on a fast model is not overload)."""


@dataclass(frozen=True, slots=True)
class SchedulingPolicy:
    """The queueing rules of one served version (from its ``batching`` config)."""

    max_batch_size: int
    """0: no batch dimension, each request runs alone."""
    max_queue_delay_s: float = 0.001
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_size: int = 1024
    default_timeout_s: float | None = None
    latency_budget_s: float | None = None
    priority_levels: int = 2
    default_priority: int = 1
    max_queue_wait_s: float | None = None
    """Longest predicted queueing wait admitted; while the queue stays late (see
    :class:`StandingQueue`) requests that waited longer are shed instead of run. None:
    automatic (see :func:`queue_wait_target`); 0 turns both off."""
    concurrency: int | None = None
    """Most requests held (queued and running); None: no such limit."""
    adaptive_concurrency: bool = False
    """Learn the limit from observed latency (:class:`~ortserve.core.adaptive.AdaptiveLimit`)."""


def queue_wait_target(policy: SchedulingPolicy, full_batch_s: float) -> float:
    """The queue-wait target in seconds (inf: none), given a full batch's predicted time.

    Automatic by default so that nobody has to size a queue: two full batches ahead keep
    the runner busy across the hand-over from one batch to the next, and anything beyond
    only adds latency (the standing queue CoDel sheds).
    """
    if policy.max_queue_wait_s is None:
        return max(AUTO_WAIT_FLOOR_S, AUTO_WAIT_BATCHES * full_batch_s)
    return policy.max_queue_wait_s if policy.max_queue_wait_s > 0 else float("inf")


class StandingQueue:
    """CoDel's test for a standing queue: the oldest request's wait has stayed above the
    target for a whole interval (twice the target).

    A burst or a stall of the machine makes waits long once, and the queue then drains: shed
    nothing. Only a queue that stays late (admission mispredicting a sustained overload) sheds,
    and only until the oldest wait is back under the target.
    """

    __slots__ = ("_late_since",)

    def __init__(self) -> None:
        self._late_since: float | None = None

    def shedding(self, oldest_wait: float, target: float, now: float) -> bool:
        """Whether requests waited past ``target`` should leave unrun now."""
        if oldest_wait <= target:
            self._late_since = None
            return False
        if self._late_since is None:
            self._late_since = now
        return now - self._late_since >= 2 * target
