"""Sticky buckets: a stable hash of the key picks a bucket; versions own contiguous ranges.

``hash % len(versions)`` reshuffles nearly every key whenever a weight changes. Here the
bucket space (``BUCKETS``) is cut into one contiguous range per version, in a fixed order, so
moving a boundary (a candidate going from 10% to 20%) moves only the keys of the buckets
between the old and the new boundary; every other key stays where it was. The hash is BLAKE2b
of the model name and the key, identical across processes, restarts and machines (Python's
``hash`` is salted per process).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["BUCKETS", "BucketRange", "bucket_of", "bucket_ranges", "bucketer", "pick"]

BUCKETS = 10_000
"""Bucket count: a weight is honoured to 0.01%."""


@dataclass(frozen=True, slots=True)
class BucketRange:
    """Buckets ``start`` (included) to ``end`` (excluded) go to ``version``."""

    version: str
    start: int
    end: int


def bucket_of(model: str, key: str) -> int:
    """The key's bucket for this model: the same on every server, every run."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8, person=_person(model))
    return int.from_bytes(digest.digest(), "big") % BUCKETS


def bucketer(model: str) -> Callable[[str], int]:
    """:func:`bucket_of` for one model, for the request path: the personalised hash state is
    built once and copied per key (a copy costs about half of building it with ``person``)."""
    base = hashlib.blake2b(digest_size=8, person=_person(model))

    def bucket(key: str) -> int:
        digest = base.copy()
        try:
            data = key.encode()  # the fast path; the same bytes wherever it succeeds
        except UnicodeEncodeError:  # a lone surrogate (a key decoded with surrogateescape)
            data = key.encode("utf-8", "surrogatepass")
        digest.update(data)
        return int.from_bytes(digest.digest(), "big") % BUCKETS

    return bucket


@functools.lru_cache(maxsize=1024)
def _person(model: str) -> bytes:
    # Salted by model so two models' splits are independent; personalisation is at most 16 bytes.
    return hashlib.blake2b(model.encode(), digest_size=16).digest()


def bucket_ranges(weights: Sequence[tuple[str, float]]) -> tuple[BucketRange, ...]:
    """Contiguous ranges in the order given, sized by weight (zero weights get none).

    Boundaries are rounded cumulative shares, so the ranges always cover every bucket exactly.
    """
    total = sum(w for _, w in weights)
    if total <= 0:
        return ()
    ranges = []
    cumulative = 0.0
    start = 0
    for version, weight in weights:
        cumulative += weight
        end = round(cumulative / total * BUCKETS)
        if end > start:
            ranges.append(BucketRange(version, start, end))
        start = max(start, end)
    return tuple(ranges)


def pick(ranges: Sequence[BucketRange], bucket: int) -> str:
    """The version whose range holds ``bucket`` (ranges are few: a linear scan)."""
    for candidate in ranges:
        if bucket < candidate.end:
            return candidate.version
    return ranges[-1].version
