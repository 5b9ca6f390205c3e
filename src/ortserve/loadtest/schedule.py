"""Intended send times for open-loop load: Poisson or uniform arrivals at a fixed rate."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

__all__ = ["ArrivalSchedule", "Arrivals"]

Arrivals = Literal["poisson", "uniform"]


@dataclass(frozen=True, slots=True)
class ArrivalSchedule:
    """Offsets in seconds from the start at which requests are meant to be sent.

    Args:
        rate: requests per second (> 0).
        arrivals: ``poisson`` (exponential gaps) or ``uniform`` (equal gaps).
        seed: seeds the exponential gaps, so a run can be repeated exactly.
        phase: offset of the first arrival as a fraction of one gap (spreads the
            arrivals of several generator processes sharing one rate).
    """

    rate: float
    arrivals: Arrivals = "poisson"
    seed: int = 0
    phase: float = 0.0

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError("rate must be positive")

    def offsets(self) -> Iterator[float]:
        """An endless, increasing sequence of send offsets."""
        gap = 1.0 / self.rate
        if self.arrivals == "uniform":
            index = 0
            while True:
                yield (index + self.phase) * gap
                index += 1
        rng = random.Random(self.seed)
        at = self.phase * gap
        while True:
            yield at
            at += rng.expovariate(self.rate)
