"""The queueing rules of one served version, as the scheduler reads them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SchedulingPolicy"]


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
