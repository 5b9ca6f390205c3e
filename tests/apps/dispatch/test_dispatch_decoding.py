"""Decoding: the assignment is optimal (most orders, then most score), capacities hold, answers
are deterministic, unassigned orders say why, candidates carry Pareto marks."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from ortserve.apps.dispatch import assignment
from ortserve.apps.dispatch.assignment import Problem, greedy, repair, solve, value
from ortserve.apps.dispatch.decoding import (
    DEADLINE_PASSED,
    NO_CAPACITY,
    NO_DEADLINE,
    TAKEN,
    PairScores,
    decode,
)


def pairs_of(score: np.ndarray, fits: np.ndarray, on_time: float | np.ndarray = 1.0) -> PairScores:
    shape = score.shape
    return PairScores(
        score.astype(np.float64),
        np.broadcast_to(np.asarray(on_time, dtype=np.float64), shape).copy(),
        np.ones(shape),
        np.ones(shape),
        fits,
    )


def instance(rng: np.random.Generator, orders: int, couriers: int, unit: bool) -> dict[str, Any]:
    weights = [1.0] * orders if unit else rng.choice([0.5, 1.0, 1.5, 2.0, 3.0], orders).tolist()
    remaining = rng.integers(1, 4, couriers).astype(float).tolist()
    fits = np.array([[w <= r for r in remaining] for w in weights])
    on_time = rng.uniform(0.0, 1.0, (orders, couriers))
    return {
        "pairs": pairs_of(rng.uniform(0.1, 1.0, (orders, couriers)), fits, on_time),
        "weights": weights,
        "remaining": remaining,
        "expired": [False] * orders,
        "order_ids": [f"o{i}" for i in range(orders)],
        "courier_ids": [f"c{j}" for j in range(couriers)],
        "top_k": 3,
        "min_on_time": 0.2,
    }


def objective(case: dict[str, Any], courier: list[int]) -> tuple[int, float]:
    score = case["pairs"].score
    return sum(c >= 0 for c in courier), float(sum(score[o, c] for o, c in enumerate(courier) if c >= 0))


def feasible(case: dict[str, Any], courier: list[int]) -> bool:
    used = [0.0] * len(case["remaining"])
    for o, c in enumerate(courier):
        if c >= 0:
            if case["pairs"].on_time[o, c] < case["min_on_time"]:
                return False
            used[c] += case["weights"][o]
    return all(u <= r + 1e-9 for u, r in zip(used, case["remaining"], strict=True))


def brute_force_optimum(case: dict[str, Any]) -> tuple[int, float]:
    orders, couriers = case["pairs"].score.shape
    best = (0, 0.0)
    for choice in itertools.product(range(-1, couriers), repeat=orders):
        if feasible(case, list(choice)):
            best = max(best, objective(case, list(choice)))
    return best


def test_on_small_random_instances_the_assignment_matches_the_exact_optimum() -> None:
    rng = np.random.default_rng(3)
    for _ in range(120):
        case = instance(rng, int(rng.integers(1, 6)), int(rng.integers(1, 4)), unit=bool(rng.random() < 0.5))
        result = decode(**case)
        assert feasible(case, result.courier)
        count, score = objective(case, result.courier)
        best_count, best_score = brute_force_optimum(case)
        assert count == best_count
        assert score == pytest.approx(best_score, abs=1e-6)
        assert result.optimal


def test_an_order_greedy_would_strand_is_served_by_moving_another_to_its_second_choice() -> None:
    # o1 prefers c1 but can also go to c2; o2 can only go to c1. Greedy gives c1 to o1.
    score = np.array([[0.9, 0.8], [0.85, 0.1]])
    fits = np.array([[True, True], [True, False]])
    problem = Problem(score, fits, np.ones(2), np.ones(2))
    assert greedy(problem).tolist() == [0, -1]
    solution = solve(problem)
    assert solution.courier.tolist() == [1, 0] and solution.method == "assignment"
    fractional = solve(Problem(score, fits, np.array([1.0, 0.5]), np.ones(2)))
    assert fractional.courier.tolist() == [1, 0] and fractional.method == "mip" and fractional.optimal


def test_when_every_order_can_have_its_best_courier_no_solver_runs() -> None:
    score = np.array([[0.9, 0.1], [0.2, 0.8]])
    solution = solve(Problem(score, np.ones((2, 2), dtype=bool), np.array([1.0, 2.0]), np.full(2, 2.0)))
    assert solution.courier.tolist() == [0, 1] and solution.method == "best_each"


def test_when_the_mip_budget_runs_out_the_greedy_answer_stands_and_is_feasible() -> None:
    rng = np.random.default_rng(6)
    case = instance(rng, 200, 40, unit=False)
    result = decode(**case, time_budget_s=1e-4)
    assert feasible(case, result.courier)
    assert result.method in ("greedy", "mip")
    if result.method == "greedy":
        assert not result.optimal
    assert all(len(c) <= 4 for c in result.candidates)
    assert all((c == -1) == (r is not None) for c, r in zip(result.courier, result.reason, strict=True))


def test_unit_weight_instances_beat_or_match_greedy_and_never_exceed_capacity() -> None:
    rng = np.random.default_rng(4)
    for _ in range(10):
        case = instance(rng, 40, 12, unit=True)
        result = decode(**case)
        assert feasible(case, result.courier)
        eligible = case["pairs"].fits & (case["pairs"].on_time >= case["min_on_time"])
        problem = Problem(case["pairs"].score, eligible, np.ones(40), np.asarray(case["remaining"]))
        assert objective(case, result.courier) >= value(problem, greedy(problem))


def test_the_answer_does_not_depend_on_the_order_orders_and_couriers_are_listed_in() -> None:
    rng = np.random.default_rng(9)
    case = instance(rng, 12, 5, unit=False)
    first = decode(**case)
    assert decode(**case) == first
    o_perm, c_perm = rng.permutation(12), rng.permutation(5)
    p = case["pairs"]
    permuted = {
        **case,
        "pairs": PairScores(
            *(a[np.ix_(o_perm, c_perm)] for a in (p.score, p.on_time, p.distance, p.balance, p.fits))
        ),
        "weights": [case["weights"][i] for i in o_perm],
        "remaining": [case["remaining"][j] for j in c_perm],
        "order_ids": [case["order_ids"][i] for i in o_perm],
        "courier_ids": [case["courier_ids"][j] for j in c_perm],
    }
    second = decode(**permuted)
    by_id = {case["order_ids"][o]: c for o, c in enumerate(first.courier)}
    for o, c in enumerate(second.courier):
        expected = by_id[permuted["order_ids"][o]]
        assert (c == -1 and expected == -1) or permuted["courier_ids"][c] == case["courier_ids"][expected]


@pytest.mark.parametrize(
    ("remaining", "on_time", "expired", "reason"),
    [
        ([0.5, 0.5], 0.9, False, NO_CAPACITY),
        ([2.0, 2.0], 0.3, False, NO_DEADLINE),
        ([1.0, 0.0], 0.9, False, TAKEN),
        ([2.0, 2.0], 0.9, True, DEADLINE_PASSED),
    ],
)
def test_unassigned_orders_say_why(
    remaining: list[float], on_time: float, expired: bool, reason: str
) -> None:
    weights = [1.0, 1.0]
    fits = np.array([[w <= r for r in remaining] for w in weights])
    score = np.array([[0.9, 0.8], [0.7, 0.6]])
    result = decode(
        pairs_of(score, fits, on_time),
        weights,
        remaining,
        [False, expired],
        ["o1", "o2"],
        ["c1", "c2"],
        2,
        0.5,
    )
    assert result.reason[1] == reason and result.courier[1] == -1


def test_min_on_time_is_the_eligibility_floor() -> None:
    score = np.array([[0.9]])
    fits = np.ones((1, 1), dtype=bool)
    args = ([1.0], [1.0], [False], ["o1"], ["c1"], 3)
    assert decode(pairs_of(score, fits, 0.3), *args, 0.25).courier == [0]
    assert decode(pairs_of(score, fits, 0.3), *args, 0.35).courier == [-1]


def test_a_courier_dominated_on_every_objective_is_marked_off_the_pareto_front() -> None:
    shape = (1, 3)
    pairs = PairScores(
        np.array([[0.9, 0.5, 0.6]]),
        np.array([[0.95, 0.9, 0.99]]),  # c2 is dominated by c1; c3 is on time more often
        np.array([[1.0, 2.0, 4.0]]),
        np.array([[0.8, 0.7, 0.6]]),
        np.ones(shape, dtype=bool),
    )
    result = decode(pairs, [1.0], [1.0, 1.0, 1.0], [False], ["o"], ["c1", "c2", "c3"], 3, 0.5)
    marks = dict(zip(result.candidates[0], result.pareto[0], strict=True))
    assert marks == {0: True, 1: False, 2: True}


def test_a_courier_outside_the_top_k_that_capacity_forced_is_listed_among_the_candidates() -> None:
    score = np.array([[0.9, 0.8, 0.2], [0.95, 0.8, 0.1]])
    fits = np.ones((2, 3), dtype=bool)
    result = decode(
        pairs_of(score, fits),
        [1.0, 1.0],
        [1.0, 1.0, 1.0],
        [False, False],
        ["a", "b"],
        ["x", "y", "z"],
        1,
        0.5,
    )
    assert sorted(result.courier) == [0, 1]
    for o, c in enumerate(result.courier):
        assert c in result.candidates[o]


def test_repair_serves_an_order_greedy_stranded_by_moving_another_out_of_the_way() -> None:
    score = np.array([[0.9, 0.8], [0.85, 0.1]])
    fits = np.array([[True, True], [True, False]])
    problem = Problem(score, fits, np.array([1.0, 0.5]), np.ones(2))
    stranded = greedy(problem)
    assert stranded.tolist() == [0, -1]
    assert repair(problem, stranded).tolist() == [1, 0]


def test_beyond_the_mip_size_the_repaired_greedy_answer_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(assignment, "MIP_MAX_PAIRS", 2)
    score = np.array([[0.9, 0.8], [0.85, 0.1]])
    fits = np.array([[True, True], [True, False]])
    solution = solve(Problem(score, fits, np.array([1.0, 0.5]), np.ones(2)))
    assert solution.method == "greedy" and not solution.optimal
    assert solution.courier.tolist() == [1, 0]


def valued_objective(case: dict[str, Any], values: list[float], courier: list[int]) -> tuple[float, float]:
    score = case["pairs"].score
    served = round(sum(values[o] for o, c in enumerate(courier) if c >= 0), 2)
    return served, float(sum(score[o, c] for o, c in enumerate(courier) if c >= 0))


def test_with_order_values_the_assignment_matches_the_exact_most_value_then_score_optimum() -> None:
    rng = np.random.default_rng(11)
    for _ in range(120):
        case = instance(rng, int(rng.integers(1, 6)), int(rng.integers(1, 4)), unit=bool(rng.random() < 0.5))
        values = rng.choice([0.5, 1.0, 2.0, 3.25], len(case["weights"])).tolist()
        result = decode(**case, values=values)
        assert feasible(case, result.courier) and result.optimal
        orders, couriers = case["pairs"].score.shape
        best = max(
            valued_objective(case, values, list(choice))
            for choice in itertools.product(range(-1, couriers), repeat=orders)
            if feasible(case, list(choice))
        )
        got = valued_objective(case, values, result.courier)
        assert got[0] == best[0] and got[1] == pytest.approx(best[1], abs=1e-6)


def test_a_valuable_heavy_order_is_served_before_two_light_ones() -> None:
    score = np.full((3, 1), 0.5)
    fits = np.ones((3, 1), dtype=bool)
    weights, room = np.array([2.0, 1.0, 1.0]), np.array([2.0])
    assert solve(Problem(score, fits, weights, room)).courier.tolist() == [-1, 0, 0]  # most orders
    valued = solve(Problem(score, fits, weights, room, np.array([3.0, 1.0, 1.0])))
    assert valued.courier.tolist() == [0, -1, -1] and valued.optimal
    assert greedy(Problem(score, fits, weights, room, np.array([3.0, 1.0, 1.0]))).tolist() == [0, -1, -1]
