"""Gray release as a pure state machine: advance one step per interval while guards hold,
fall back to 0% and ``rejected`` when one breaks.

No clock and no I/O: :func:`evaluate` takes the time and the window's statistics (the
candidate's and the baseline's outcomes since the step began, and the divergence of the pairs
compared meanwhile) and returns the next state and, when something happened, the event.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from ortserve.config.routing import GuardsConfig, RolloutConfig

__all__ = ["DivergenceWindow", "Phase", "RolloutState", "WindowStats", "evaluate", "guard_breach", "start"]


class Phase(enum.Enum):
    PROGRESSING = "progressing"
    COMPLETED = "completed"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class WindowStats:
    """One version's outcomes since the window began."""

    requests: int
    errors: int
    p99_s: float | None


@dataclass(frozen=True, slots=True)
class DivergenceWindow:
    """Baseline/candidate pairs compared since the window began."""

    pairs: int
    p99_max_abs: float | None


@dataclass(frozen=True, slots=True)
class RolloutState:
    """Where a rollout stands: ``share`` is the candidate's percentage in force now."""

    phase: Phase
    step: int
    share: float
    window_start: float
    reason: str = ""


def start(plan: RolloutConfig, now: float) -> RolloutState:
    return RolloutState(Phase.PROGRESSING, 0, plan.steps[0], now)


def guard_breach(
    guards: GuardsConfig,
    min_requests: int,
    candidate: WindowStats,
    baseline: WindowStats,
    divergence: DivergenceWindow | None,
) -> str | None:
    """Which guard the window breaks, with the figures; None while all hold or too few requests
    have been seen to judge (``min_requests`` candidate requests, a tenth as many pairs)."""
    if candidate.requests >= min_requests:
        breach = _errors(guards, candidate) or _latency(guards, candidate, baseline)
        if breach is not None:
            return breach
    return _divergence(guards, min_requests, divergence)


def _errors(guards: GuardsConfig, candidate: WindowStats) -> str | None:
    rate = candidate.errors / candidate.requests
    if guards.max_error_rate is None or rate <= guards.max_error_rate:
        return None
    return (
        f"max_error_rate: error rate {rate:.4f} > {guards.max_error_rate:g} "
        f"({candidate.errors} of {candidate.requests} requests)"
    )


def _latency(guards: GuardsConfig, candidate: WindowStats, baseline: WindowStats) -> str | None:
    limit = guards.max_p99_ratio
    if limit is None or candidate.p99_s is None or baseline.p99_s is None or baseline.p99_s <= 0:
        return None
    ratio = candidate.p99_s / baseline.p99_s
    if ratio <= limit:
        return None
    return (
        f"max_p99_ratio: p99 {candidate.p99_s * 1e3:.3f} ms vs baseline "
        f"{baseline.p99_s * 1e3:.3f} ms, ratio {ratio:.2f} > {limit:g}"
    )


def _divergence(guards: GuardsConfig, min_requests: int, divergence: DivergenceWindow | None) -> str | None:
    limit = guards.max_divergence
    if limit is None or divergence is None or divergence.p99_max_abs is None:
        return None
    if divergence.pairs < max(1, min_requests // 10) or divergence.p99_max_abs <= limit:
        return None
    return (
        f"max_divergence: p99 of max abs difference {divergence.p99_max_abs:.6g} > {limit:g} "
        f"over {divergence.pairs} compared pairs"
    )


def evaluate(
    plan: RolloutConfig,
    state: RolloutState,
    now: float,
    candidate: WindowStats,
    baseline: WindowStats,
    divergence: DivergenceWindow | None,
) -> tuple[RolloutState, str | None]:
    """The next state and the event (``advanced``, ``completed``, ``rejected``) or None.

    Guards are judged as soon as the window holds enough requests, so a failing candidate goes
    back to 0% without waiting for the interval; a step advances only when the interval has
    passed, the window holds ``min_requests`` candidate requests, and every guard holds.
    """
    if state.phase is not Phase.PROGRESSING:
        return state, None
    breach = guard_breach(plan.guards, plan.min_requests, candidate, baseline, divergence)
    if breach is not None:
        reason = f"rolled back at {state.share:g}%: {breach}"
        return replace(state, phase=Phase.REJECTED, share=0.0, reason=reason), "rejected"
    if now - state.window_start < plan.interval or candidate.requests < plan.min_requests:
        return state, None
    if state.step + 1 >= len(plan.steps):
        return replace(state, phase=Phase.COMPLETED, window_start=now), "completed"
    step = state.step + 1
    return RolloutState(Phase.PROGRESSING, step, plan.steps[step], now), "advanced"
