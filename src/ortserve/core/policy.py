"""The queueing rules of one served version, as the scheduler reads them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SchedulingPolicy"]

AUTO_WAIT_BATCHES = 4
"""Automatic queue-wait target: this many full batches of work ahead of a request ..."""
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
    """Longest predicted queueing wait admitted; requests that waited twice as long are shed
    instead of run. None: automatic (see :func:`queue_wait_target`); 0 turns both off."""


def queue_wait_target(policy: SchedulingPolicy, full_batch_s: float) -> float:
    """The queue-wait target in seconds (inf: none), given a full batch's predicted time.

    Automatic by default so that nobody has to size a queue: a few full batches ahead keep
    the runner busy across the hand-over from one batch to the next, and anything beyond
    only adds latency (the standing queue CoDel sheds).
    """
    if policy.max_queue_wait_s is None:
        return max(AUTO_WAIT_FLOOR_S, AUTO_WAIT_BATCHES * full_batch_s)
    return policy.max_queue_wait_s if policy.max_queue_wait_s > 0 else float("inf")
