"""The routing decision: (policy, request view, a random draw) -> the version that serves.

Pure: no I/O, no clock, no registry. The router gives it what the request carries (explicit
version, override value, sticky key) and the bucket ranges in force (from the split, or from
the rollout's current step), and gets back a version and why it was chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ortserve.config.routing import RoutingConfig
from ortserve.routing.buckets import BUCKETS, BucketRange, bucket_of, bucket_ranges, pick

__all__ = ["Choice", "Policy", "RequestView", "choose", "split_weights", "static_ranges"]


class RequestView(NamedTuple):
    """What of a request the policy reads (a tuple: built per request)."""

    explicit: str | None = None
    """The version named in the URL or ``model_version``."""
    override: str | None = None
    """The override header's or parameter's value."""
    key: str | None = None
    """The sticky key (header, parameter or body field)."""


class Choice(NamedTuple):
    """The version chosen and why: explicit, override, sticky, random or default."""

    version: str
    reason: str


@dataclass(frozen=True, slots=True)
class Policy:
    """A validated ``routing:`` section, with what the request path needs precomputed."""

    config: RoutingConfig
    override_header: str | None
    """Lowercase, as both transports hand headers over."""
    sticky_header: str | None
    override_parameter: str | None = None
    sticky_parameter: str | None = None
    sticky_field: str | None = None

    @classmethod
    def of(cls, config: RoutingConfig) -> Policy:
        override = config.override
        sticky = config.sticky
        return cls(
            config,
            override.header.lower() if override and override.header else None,
            sticky.header.lower() if sticky and sticky.header else None,
            override.parameter if override else None,
            sticky.parameter if sticky else None,
            sticky.field if sticky else None,
        )

    def variant(self, value: str) -> str:
        """The version a named variant stands for (the value itself when it names none)."""
        override = self.config.override
        return override.variants.get(value, value) if override is not None else value


def split_weights(split: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    """A split in bucket order: by version number, so the newest version holds the top range
    and raising it moves only the buckets next to the boundary."""
    return tuple(sorted(split.items(), key=lambda item: int(item[0])))


def choose(
    policy: Policy,
    ranges: Sequence[BucketRange],
    view: RequestView,
    model: str,
    draw: Callable[[], float],
    default: Callable[[], str],
) -> Choice:
    """Explicit version, then override, then the bucket ranges (sticky key or random draw),
    then ``default`` (the newest version serving traffic) when no range is in force.

    Args:
        ranges: the split in force (empty: no split).
        draw: uniform in [0, 1), called only for requests without a sticky key.
        default: called only when neither a version nor a split decides.
    """
    if view.explicit:
        return Choice(view.explicit, "explicit")
    if view.override:
        return Choice(policy.variant(view.override), "override")
    if not ranges:
        return Choice(default(), "default")
    if view.key is not None:
        return Choice(pick(ranges, bucket_of(model, view.key)), "sticky")
    return Choice(pick(ranges, min(int(draw() * BUCKETS), BUCKETS - 1)), "random")


def static_ranges(policy: Policy) -> tuple[BucketRange, ...]:
    """The ranges of the configured split (none without one)."""
    split = policy.config.split
    return bucket_ranges(split_weights(split)) if split else ()
