"""Decoding: capacities respected globally, each order at most once, near-optimal totals."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from ortserve.apps.dispatch.decoding import NO_CAPACITY, NO_DEADLINE, TAKEN, decode


def instance(rng: np.random.Generator, orders: int, couriers: int, unit: bool) -> dict[str, Any]:
    weights = [1.0] * orders if unit else rng.choice([1.0, 2.0, 3.0], orders).tolist()
    remaining = rng.integers(1, 4, couriers).astype(float).tolist()
    fits = np.array([[w <= r for r in remaining] for w in weights])
    return {
        "score": rng.uniform(0.1, 1.0, (orders, couriers)).astype(np.float32),
        "on_time": np.ones((orders, couriers), dtype=np.float32),
        "fits": fits,
        "weights": weights,
        "remaining": remaining,
        "order_ids": [f"o{i}" for i in range(orders)],
        "courier_ids": [f"c{j}" for j in range(couriers)],
    }


def total(case: dict[str, Any], courier: list[int]) -> float:
    score = case["score"]
    return float(sum(score[o, c] for o, c in enumerate(courier) if c >= 0))


def brute_force_optimum(case: dict[str, Any]) -> float:
    orders, couriers = case["score"].shape
    best = 0.0
    for choice in itertools.product(range(-1, couriers), repeat=orders):
        used = [0.0] * couriers
        for o, c in enumerate(choice):
            if c >= 0:
                used[c] += case["weights"][o]
        if all(u <= r for u, r in zip(used, case["remaining"], strict=True)):
            best = max(best, total(case, list(choice)))
    return best


def check_feasible(case: dict[str, Any], courier: list[int]) -> None:
    used = [0.0] * len(case["remaining"])
    for o, c in enumerate(courier):
        if c >= 0:
            used[c] += case["weights"][o]
    assert all(u <= r + 1e-9 for u, r in zip(used, case["remaining"], strict=True))


def test_on_small_instances_the_total_is_close_to_the_brute_force_optimum() -> None:
    rng = np.random.default_rng(3)
    ratios = []
    for _ in range(150):
        case = instance(rng, int(rng.integers(1, 6)), int(rng.integers(1, 4)), unit=bool(rng.random() < 0.5))
        result = decode(**case, top_k=3)
        check_feasible(case, result.courier)
        optimum = brute_force_optimum(case)
        ratios.append(total(case, result.courier) / optimum if optimum else 1.0 + total(case, result.courier))
    assert min(ratios) >= 0.5
    assert float(np.mean(ratios)) >= 0.95


def test_with_unit_weights_the_total_is_close_to_the_optimal_assignment_of_courier_slots() -> None:
    rng = np.random.default_rng(4)
    for _ in range(20):
        case = instance(rng, 30, 10, unit=True)
        slots = [c for c, room in enumerate(case["remaining"]) for _ in range(int(room))]
        gain = case["score"][:, slots]
        rows, cols = linear_sum_assignment(gain, maximize=True)
        optimum = float(gain[rows, cols].sum())
        result = decode(**case, top_k=10)
        check_feasible(case, result.courier)
        assert total(case, result.courier) >= 0.9 * optimum


def test_no_courier_exceeds_capacity_and_no_order_is_assigned_twice_on_large_instances() -> None:
    rng = np.random.default_rng(5)
    case = instance(rng, 200, 40, unit=False)
    result = decode(**case, top_k=3)
    check_feasible(case, result.courier)
    assert len(result.courier) == 200
    assert all(len(c) <= 3 for c in result.candidates)
    assert all((c == -1) == (r is not None) for c, r in zip(result.courier, result.reason, strict=True))


def test_ties_break_deterministically_by_order_then_courier_id() -> None:
    case: dict[str, Any] = {
        "score": np.full((2, 2), 0.5, dtype=np.float32),
        "on_time": np.ones((2, 2), dtype=np.float32),
        "fits": np.ones((2, 2), dtype=bool),
        "weights": [1.0, 1.0],
        "remaining": [1.0, 1.0],
        "order_ids": ["b", "a"],
        "courier_ids": ["y", "x"],
    }
    first = decode(**case, top_k=2)
    assert first.courier == [0, 1]  # order "a" takes courier "x" first
    assert first.candidates == [[1, 0], [1, 0]]
    assert decode(**case, top_k=2) == first


@pytest.mark.parametrize(
    ("remaining", "on_time", "reason"),
    [([0.5, 0.5], 0.9, NO_CAPACITY), ([2.0, 2.0], 0.01, NO_DEADLINE), ([1.0, 0.0], 0.9, TAKEN)],
)
def test_unassigned_orders_say_why(remaining: list[float], on_time: float, reason: str) -> None:
    weights = [1.0, 1.0]
    fits = np.array([[w <= r for r in remaining] for w in weights])
    score = np.array([[0.9, 0.8], [0.7, 0.6]], dtype=np.float32)
    result = decode(
        score,
        np.full((2, 2), on_time, dtype=np.float32),
        fits,
        weights,
        remaining,
        ["o1", "o2"],
        ["c1", "c2"],
        2,
    )
    assert result.reason[1] == reason and result.courier[1] == -1
