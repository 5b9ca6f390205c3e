"""An HDR-style log-linear latency histogram: constant relative precision, mergeable."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Histogram"]


@dataclass(slots=True)
class Histogram:
    """Counts of integer values (microseconds) with ``significant_digits`` of precision.

    Values below ``2 * 10**significant_digits`` (rounded up to a power of two) are kept
    exactly; above that, every value shares its bucket only with values within a relative
    distance of ``1 / sub_bucket_half`` (under 0.1% for 3 digits), as in HdrHistogram.
    Percentiles report the highest value equivalent to the bucket they fall in, so a
    reported percentile is never below the true one and at most that precision above it.

    Args:
        significant_digits: 1 to 5 decimal digits of precision.
    """

    significant_digits: int = 3
    counts: list[int] = field(default_factory=list)
    total: int = 0
    min_value: int = 0
    max_value: int = 0
    _sub_bits: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.significant_digits <= 5:
            raise ValueError("significant_digits must be between 1 and 5")
        self._sub_bits = (2 * 10**self.significant_digits - 1).bit_length()

    @property
    def relative_precision(self) -> float:
        """Largest relative distance between a value and the value reported for it."""
        return 1.0 / (1 << (self._sub_bits - 1))

    def _index(self, value: int) -> int:
        shift = value.bit_length() - self._sub_bits
        if shift <= 0:
            return value
        half = 1 << (self._sub_bits - 1)
        return (1 << self._sub_bits) + (shift - 1) * half + ((value >> shift) - half)

    def _bucket_bounds(self, index: int) -> tuple[int, int]:
        """The lowest and highest value a bucket holds."""
        full = 1 << self._sub_bits
        if index < full:
            return index, index
        half = full >> 1
        shift = (index - full) // half + 1
        low = ((index - full) % half + half) << shift
        return low, low + (1 << shift) - 1

    def record(self, value: int, count: int = 1) -> None:
        """Count ``value`` (clamped to >= 0) ``count`` times."""
        value = max(0, value)
        index = self._index(value)
        counts = self.counts
        if index >= len(counts):
            counts.extend([0] * (index + 1 - len(counts)))
        counts[index] += count
        if self.total == 0 or value < self.min_value:
            self.min_value = value
        if value > self.max_value:
            self.max_value = value
        self.total += count

    def merge(self, other: Histogram) -> None:
        """Add every count of ``other`` (same precision) into this histogram."""
        if other.significant_digits != self.significant_digits:
            raise ValueError("cannot merge histograms of different precision")
        if other.total == 0:
            return
        if len(other.counts) > len(self.counts):
            self.counts.extend([0] * (len(other.counts) - len(self.counts)))
        for index, count in enumerate(other.counts):
            if count:
                self.counts[index] += count
        self.min_value = other.min_value if self.total == 0 else min(self.min_value, other.min_value)
        self.max_value = max(self.max_value, other.max_value)
        self.total += other.total

    def percentile(self, percent: float) -> int:
        """The value at ``percent`` (0-100): highest equivalent value of its bucket, <= max."""
        if self.total == 0:
            return 0
        if percent >= 100.0:
            return self.max_value
        wanted = max(1, -(-self.total * percent // 100))
        seen = 0
        for index, count in enumerate(self.counts):
            seen += count
            if seen >= wanted:
                return min(self._bucket_bounds(index)[1], self.max_value)
        return self.max_value

    def mean(self) -> float:
        """Mean of the bucket midpoints (exact to the histogram's precision)."""
        if self.total == 0:
            return 0.0
        weighted = 0.0
        for index, count in enumerate(self.counts):
            if count:
                low, high = self._bucket_bounds(index)
                weighted += count * (low + high) / 2
        return weighted / self.total

    def to_dict(self) -> dict[str, object]:
        """A compact, JSON-friendly form (non-zero buckets only) for other processes."""
        return {
            "significant_digits": self.significant_digits,
            "total": self.total,
            "min": self.min_value,
            "max": self.max_value,
            "buckets": [[i, c] for i, c in enumerate(self.counts) if c],
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Histogram:
        """Rebuild a histogram written by :meth:`to_dict`."""
        digits = data["significant_digits"]
        buckets = data["buckets"]
        if not isinstance(digits, int) or not isinstance(buckets, list):
            raise ValueError("not a serialised histogram")
        histogram = cls(digits)
        if buckets:
            histogram.counts = [0] * (max(int(i) for i, _ in buckets) + 1)
            for index, count in buckets:
                histogram.counts[int(index)] = int(count)
        histogram.total = int(str(data["total"]))
        histogram.min_value = int(str(data["min"]))
        histogram.max_value = int(str(data["max"]))
        return histogram
