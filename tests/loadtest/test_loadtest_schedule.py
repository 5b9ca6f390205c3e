"""Open-loop arrival schedules: exact uniform gaps, Poisson at the asked mean rate, repeatable."""

from __future__ import annotations

import itertools

import pytest

from ortserve.loadtest.generator import LoadLevel
from ortserve.loadtest.schedule import ArrivalSchedule


def test_uniform_arrivals_are_evenly_spaced() -> None:
    offsets = list(itertools.islice(ArrivalSchedule(200, "uniform").offsets(), 5))
    assert offsets == pytest.approx([0.0, 0.005, 0.010, 0.015, 0.020])


def test_poisson_arrivals_average_the_asked_rate_and_repeat_with_a_seed() -> None:
    schedule = ArrivalSchedule(1000, "poisson", seed=3)
    offsets = list(itertools.islice(schedule.offsets(), 50_001))
    assert 50_000 / offsets[-1] == pytest.approx(1000, rel=0.02)
    assert offsets[:100] == list(itertools.islice(ArrivalSchedule(1000, "poisson", seed=3).offsets(), 100))
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert min(gaps) >= 0 and max(gaps) > 5 / 1000  # exponential gaps, not a fixed step


def test_a_level_splits_across_generator_processes_without_losing_load() -> None:
    closed = LoadLevel(concurrency=5, requests=101)
    shares = [closed.share(i, 2) for i in range(2)]
    assert [(s.concurrency, s.requests) for s in shares if s] == [(3, 51), (2, 50)]
    opened = LoadLevel(rate=300.0, duration_s=1.0)
    rates = [s.rate for i in range(3) if (s := opened.share(i, 3))]
    assert sum(r for r in rates if r) == pytest.approx(300.0)
    assert LoadLevel(concurrency=1, requests=10).share(1, 2) is None


def test_uniform_arrivals_of_several_processes_interleave() -> None:
    level = LoadLevel(rate=300.0, arrivals="uniform", duration_s=1.0)
    offsets = sorted(
        offset
        for index in range(3)
        if (share := level.share(index, 3)) is not None and share.rate is not None
        for offset in itertools.islice(ArrivalSchedule(share.rate, "uniform", phase=share.phase).offsets(), 4)
    )
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert gaps == pytest.approx([1 / 300] * len(gaps))
