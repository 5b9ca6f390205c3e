"""What the routing ``GET`` shows of one router: policy, bucket ranges, counts, roles,
rollout progress and shadow comparison, as plain JSON-ready values."""

from __future__ import annotations

from typing import Any

from ortserve.routing.buckets import BUCKETS
from ortserve.routing.outcomes import VersionOutcomes
from ortserve.routing.router import ModelRouter

__all__ = ["router_snapshot"]


def router_snapshot(router: ModelRouter) -> dict[str, Any]:
    config = router.policy.config
    return {
        "policy": config.model_dump(mode="json"),
        "buckets": [
            {
                "version": r.version,
                "start": r.start,
                "end": r.end,
                "percent": 100 * (r.end - r.start) / BUCKETS,
            }
            for r in router.ranges()
        ],
        "roles": {version: role.value for version, role in sorted(router.roles().items())},
        "versions": {
            version: _counts(router, version, seen) for version, seen in sorted(router.outcomes.items())
        },
        "rollout": _rollout(router),
        "shadow": _shadow(router),
        "retired": dict(router.retired),
    }


def _counts(router: ModelRouter, version: str, seen: VersionOutcomes) -> dict[str, Any]:
    window = seen.window()
    return {
        "requests": seen.requests,
        "errors": seen.errors if router.tracks_outcomes else None,
        "by_reason": {reason: n for (v, reason), n in sorted(router.reasons.items()) if v == version},
        "window": {
            "requests": window.requests,
            "errors": window.errors,
            "p99_ms": None if window.p99_s is None else window.p99_s * 1e3,
        },
    }


def _rollout(router: ModelRouter) -> dict[str, Any] | None:
    plan = router.policy.config.rollout
    state = router.rollout
    if plan is None or state is None:
        return None
    return {
        "candidate": plan.candidate,
        "baseline": plan.baseline,
        "state": state.phase.value,
        "step": state.step,
        "share_percent": state.share,
        "steps": plan.steps,
        "reason": state.reason,
        "events": dict(router.events),
    }


def _shadow(router: ModelRouter) -> dict[str, Any]:
    lane = router.shadow
    return {
        "inflight": lane.inflight,
        "sent": dict(lane.sent),
        "compared": dict(lane.compared),
        "dropped": dict(lane.dropped),
        "divergence": router.book.summary(),
    }
