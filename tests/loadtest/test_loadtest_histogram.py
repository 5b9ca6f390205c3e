"""The load generator's HDR-style histogram: exact small values, bounded relative error, merging."""

from __future__ import annotations

import math
import random

import pytest

from ortserve.loadtest.histogram import Histogram


def _true_percentile(values: list[int], percent: float) -> int:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(len(ordered) * percent / 100) - 1)]


def test_values_below_the_sub_bucket_range_are_exact() -> None:
    histogram = Histogram(3)
    for value in range(1, 2001):
        histogram.record(value)
    assert histogram.percentile(50) == 1000
    assert histogram.percentile(99.9) == 1998
    assert histogram.min_value == 1 and histogram.max_value == 2000


@pytest.mark.parametrize("digits", [2, 3])
def test_percentiles_are_within_the_stated_precision(digits: int) -> None:
    rng = random.Random(digits)
    values = [int(rng.lognormvariate(8, 2)) for _ in range(20_000)]
    histogram = Histogram(digits)
    for value in values:
        histogram.record(value)
    for percent in (50, 90, 99, 99.9):
        true = _true_percentile(values, percent)
        reported = histogram.percentile(percent)
        assert true <= reported <= true * (1 + histogram.relative_precision) + 1


def test_three_digits_means_better_than_a_tenth_of_a_percent() -> None:
    assert Histogram(3).relative_precision < 0.001


def test_merging_equals_recording_everything_in_one() -> None:
    rng = random.Random(1)
    a, b, both = Histogram(), Histogram(), Histogram()
    for index in range(5000):
        value = rng.randrange(10**7)
        (a if index % 2 else b).record(value)
        both.record(value)
    a.merge(b)
    assert a.counts == both.counts
    assert (a.total, a.min_value, a.max_value) == (both.total, both.min_value, both.max_value)


def test_a_histogram_survives_the_trip_to_another_process() -> None:
    histogram = Histogram()
    for value in (3, 5_000, 7_000_000):
        histogram.record(value)
    copy = Histogram.from_dict(histogram.to_dict())
    assert copy.counts == histogram.counts
    assert copy.percentile(100) == 7_000_000 and copy.min_value == 3


def test_an_empty_histogram_reports_zero() -> None:
    assert Histogram().percentile(99) == 0 and Histogram().mean() == 0.0


def test_histograms_of_different_precision_do_not_merge() -> None:
    with pytest.raises(ValueError, match="precision"):
        Histogram(2).merge(Histogram(3))
