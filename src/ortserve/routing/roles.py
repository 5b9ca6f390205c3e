"""Traffic roles of a model's versions: active, canary, shadow, deprecated, rejected.

Derived, not stored: from the policy in force, the rollout's state and the versions serving,
so the repository index, model metadata, the gauge and the routing ``GET`` always agree.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping

from ortserve.routing.buckets import BucketRange
from ortserve.routing.rollout import Phase, RolloutState

__all__ = ["Role", "version_roles"]


class Role(enum.Enum):
    ACTIVE = "active"
    """Takes default traffic (the split's largest share, or the newest version)."""
    CANARY = "canary"
    """Takes a smaller share: a rollout's candidate, or a minor split member."""
    SHADOW = "shadow"
    """Sees copies of requests only; its answers are compared, never returned."""
    DEPRECATED = "deprecated"
    """Takes no default traffic any more (explicit requests still reach it while loaded)."""
    REJECTED = "rejected"
    """A rollout candidate that broke a guard: back to 0%."""


def version_roles(
    served: Collection[str],
    ranges: tuple[BucketRange, ...],
    default: str | None,
    shadow: str | None,
    deprecated: Collection[str],
    rollout: tuple[str, str, RolloutState] | None,
    retired: Mapping[str, str],
) -> dict[str, Role]:
    """The role of every served or retired version.

    Args:
        ranges: the split in force; default: the version taking traffic without one.
        rollout: (candidate, baseline, state) when a rollout is configured.
        retired: versions retired automatically (deprecated even though no longer loaded).
    """
    shares: dict[str, int] = {}
    for found in ranges:
        shares[found.version] = shares.get(found.version, 0) + found.end - found.start
    largest = max(shares.values(), default=0)
    roles = {}
    for version in served:
        if version in deprecated:
            roles[version] = Role.DEPRECATED
        elif shares:
            roles[version] = (
                Role.ACTIVE
                if shares.get(version, 0) == largest
                else (Role.CANARY if version in shares else Role.ACTIVE)
            )
        else:
            roles[version] = Role.ACTIVE
        if version == shadow and version not in shares and version != default:
            roles[version] = Role.SHADOW
    if rollout is not None:
        candidate, baseline, state = rollout
        if state.phase is Phase.REJECTED:
            roles[candidate] = Role.REJECTED
        elif state.phase is Phase.COMPLETED and state.share >= 100:
            roles[candidate] = Role.ACTIVE
            roles[baseline] = Role.DEPRECATED
        else:
            roles[candidate] = Role.CANARY
            roles[baseline] = Role.ACTIVE
    for version in retired:
        roles[version] = Role.DEPRECATED
    return roles
