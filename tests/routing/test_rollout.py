"""The rollout state machine: steps advance on a healthy window, a broken guard rolls back."""

from __future__ import annotations

import pytest

from ortserve.config.routing import RolloutConfig
from ortserve.routing.rollout import DivergenceWindow, Phase, RolloutState, WindowStats, evaluate, start

PLAN = RolloutConfig.model_validate(
    {
        "candidate": "2",
        "baseline": "1",
        "steps": [5, 25, 100],
        "interval": "10s",
        "min_requests": 100,
        "guards": {"max_error_rate": 0.01, "max_p99_ratio": 1.5, "max_divergence": 0.01},
    }
)
HEALTHY = WindowStats(100, 0, 0.010)
BASELINE = WindowStats(1000, 0, 0.010)
CLOSE = DivergenceWindow(20, 1e-6)


def test_a_healthy_candidate_advances_one_step_per_interval_then_completes() -> None:
    state = start(PLAN, 0.0)
    assert (state.phase, state.share) == (Phase.PROGRESSING, 5)
    events = []
    for now in (5.0, 10.0, 20.0, 30.0):
        state, event = evaluate(PLAN, state, now, HEALTHY, BASELINE, CLOSE)
        events.append(event)
    assert events == [None, "advanced", "advanced", "completed"]
    assert (state.phase, state.share) == (Phase.COMPLETED, 100)


def test_a_step_waits_for_min_requests_even_after_the_interval() -> None:
    state = start(PLAN, 0.0)
    state, event = evaluate(PLAN, state, 60.0, WindowStats(99, 0, 0.01), BASELINE, None)
    assert event is None and state.share == 5


@pytest.mark.parametrize(
    ("candidate", "divergence", "guard"),
    [
        (WindowStats(100, 2, 0.010), CLOSE, "max_error_rate"),
        (WindowStats(100, 0, 0.016), CLOSE, "max_p99_ratio"),
        (HEALTHY, DivergenceWindow(10, 0.5), "max_divergence"),
    ],
)
def test_a_broken_guard_rolls_back_to_zero_with_the_reason(
    candidate: WindowStats, divergence: DivergenceWindow, guard: str
) -> None:
    state = RolloutState(Phase.PROGRESSING, 1, 25, 0.0)
    state, event = evaluate(PLAN, state, 1.0, candidate, BASELINE, divergence)
    assert event == "rejected"
    assert (state.phase, state.share) == (Phase.REJECTED, 0.0)
    assert state.reason.startswith(f"rolled back at 25%: {guard}")


def test_guards_wait_for_enough_requests_and_pairs() -> None:
    state = start(PLAN, 0.0)
    few_errors = WindowStats(50, 50, 0.5)
    few_pairs = DivergenceWindow(9, 1.0)
    assert evaluate(PLAN, state, 1.0, few_errors, BASELINE, few_pairs) == (state, None)


def test_a_rejected_or_completed_rollout_stays_put() -> None:
    rejected = RolloutState(Phase.REJECTED, 0, 0.0, 0.0, "x")
    assert evaluate(PLAN, rejected, 99.0, HEALTHY, BASELINE, CLOSE) == (rejected, None)
