"""Capacity-respecting assignment of orders to couriers as an optimisation: serve as much order
value as possible (each order worth 1 unless the request gives values: then the most orders),
then maximise the total score, over every eligible pair.

Equal weights reduce to a rectangular assignment over courier slots (Hungarian-type, exact and
polynomial). Unequal weights make it a generalised assignment problem (NP-hard): it is solved
as a small MIP with a time budget, and the greedy answer stands in when the budget runs out
before the MIP finds a better one. A cheap check skips all of them when every servable order's
best courier has room for all the orders that chose it (then that is optimal).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy.optimize import Bounds, LinearConstraint, linear_sum_assignment, milp
from scipy.sparse import csr_array

__all__ = [
    "MIP_MAX_PAIRS",
    "MIP_TIME_BUDGET_S",
    "VALUE_STEP",
    "Method",
    "Problem",
    "Solution",
    "greedy",
    "repair",
    "solve",
]

MIP_TIME_BUDGET_S = 1.0
"""Wall time the MIP may take on unequal weights before the repaired greedy answer is kept."""
MIP_MAX_PAIRS = 20_000
"""Beyond this many eligible pairs the MIP would spend its budget setting up: greedy at once."""
_ROOM_SLACK = 1e-9
VALUE_STEP = 0.01
"""Order values are multiples of this: then one step of value outweighs any score difference
(scores lie in [0, 1]) with a bonus of (orders + 1) / VALUE_STEP per unit of value."""

Floats = npt.NDArray[np.float64]
Method = Literal["best_each", "assignment", "mip", "greedy"]


@dataclass(frozen=True, slots=True)
class Problem:
    """Orders x couriers: ``score`` counts only where ``eligible``; each courier carries at most
    ``room`` of the orders' ``weights``."""

    score: Floats
    eligible: npt.NDArray[np.bool_]
    weights: Floats
    room: Floats
    values: Floats | None = None
    """Each order's value, a multiple of ``VALUE_STEP``; None: every order is worth 1."""

    def worth(self) -> Floats:
        """Each order's value (ones when the request gave none)."""
        return np.ones(self.score.shape[0]) if self.values is None else self.values

    def bonus(self) -> float:
        """Gain per unit of value, above any total score (see ``VALUE_STEP``)."""
        orders = float(self.score.shape[0] + 1)
        return orders if self.values is None else orders / VALUE_STEP


@dataclass(frozen=True, slots=True)
class Solution:
    """``courier[o]`` is order o's courier or -1; ``optimal`` says whether it is proven optimal."""

    courier: npt.NDArray[np.int64]
    method: Method
    optimal: bool


def value(problem: Problem, courier: npt.NDArray[np.int64]) -> tuple[float, float]:
    """(value served, total score): the lexicographic objective; the value served is the count
    of orders served when the request gave no values."""
    rows = np.flatnonzero(courier >= 0)
    served = float(np.round(problem.worth()[rows].sum() / VALUE_STEP) * VALUE_STEP)
    return served, float(problem.score[rows, courier[rows]].sum())


def greedy(problem: Problem) -> npt.NDArray[np.int64]:
    """Pairs by descending order value, then score (ties: order, then courier index), each taken
    if both are free."""
    orders, couriers = np.nonzero(problem.eligible)
    ranked = np.lexsort((couriers, orders, -problem.score[orders, couriers], -problem.worth()[orders]))
    courier = [-1] * problem.score.shape[0]
    room = problem.room.tolist()
    weights = problem.weights.tolist()
    left = int(problem.eligible.any(axis=1).sum())
    for o, c in zip(orders[ranked].tolist(), couriers[ranked].tolist(), strict=True):
        if courier[o] == -1 and room[c] + _ROOM_SLACK >= weights[o]:
            courier[o] = c
            room[c] -= weights[o]
            left -= 1
            if left == 0:
                break
    return np.array(courier, dtype=np.int64)


def repair(problem: Problem, courier: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Serve stranded orders by moving one order out of the way: for a stranded order, a
    courier it could take is freed by moving one of that courier's orders to another courier
    with room (an augmenting path of length two). Each move serves one more order."""
    courier = courier.copy()
    weights = problem.weights
    room = problem.room - np.bincount(
        courier[courier >= 0], weights=weights[courier >= 0], minlength=len(problem.room)
    )
    stranded = np.flatnonzero((courier < 0) & problem.eligible.any(axis=1))
    stranded = stranded[np.argsort(-problem.worth()[stranded], kind="stable")]
    for o in stranded.tolist():
        for c in np.flatnonzero(problem.eligible[o])[
            np.argsort(-problem.score[o, problem.eligible[o]], kind="stable")
        ].tolist():
            need = weights[o] - room[c] - _ROOM_SLACK
            for other in np.flatnonzero((courier == c) & (weights >= need)).tolist():
                free = np.flatnonzero(problem.eligible[other] & (room + _ROOM_SLACK >= weights[other]))
                free = free[free != c]
                if len(free):
                    target = int(free[np.argmax(problem.score[other, free])])
                    courier[other], courier[o] = target, c
                    room[target] -= weights[other]
                    room[c] += weights[other] - weights[o]
                    break
            if courier[o] >= 0:
                break
    return courier


def _best_each(problem: Problem) -> npt.NDArray[np.int64] | None:
    """Every servable order with its highest-scoring eligible courier (ties: lower index), when
    that fits every courier's room: then it is optimal (nothing serves more, nothing scores
    more). None when it does not fit."""
    masked = np.where(problem.eligible, problem.score, -np.inf)
    best = np.argmax(masked, axis=1)
    servable = problem.eligible.any(axis=1)
    load = np.bincount(best[servable], weights=problem.weights[servable], minlength=len(problem.room))
    if np.any(load > problem.room + _ROOM_SLACK):
        return None
    return np.where(servable, best, -1).astype(np.int64)


def _slots(problem: Problem, weight: float) -> npt.NDArray[np.int64]:
    """Courier index of every slot: as many as the courier's room holds, at most one per
    order it could take (more could never be used)."""
    fit = np.floor(problem.room / weight + _ROOM_SLACK).astype(np.int64)
    useful = np.minimum(np.maximum(fit, 0), problem.eligible.sum(axis=0))
    return np.repeat(np.arange(len(useful)), useful)


def _assignment(problem: Problem) -> npt.NDArray[np.int64]:
    """Exact for equal weights: one more order (or value step) served always outweighs any score
    difference (scores lie in [0, 1], so a bonus of orders + 1 per order or value step is enough)."""
    orders = problem.score.shape[0]
    slot_courier = _slots(problem, float(problem.weights[0]))
    courier = np.full(orders, -1, dtype=np.int64)
    if len(slot_courier) == 0:
        return courier
    bonus = problem.bonus() * problem.worth()[:, None]
    gain = np.where(problem.eligible[:, slot_courier], problem.score[:, slot_courier] + bonus, 0.0)
    rows, cols = linear_sum_assignment(gain, maximize=True)
    keep = gain[rows, cols] > 0
    courier[rows[keep]] = slot_courier[cols[keep]]
    return courier


def _mip(problem: Problem, time_budget_s: float) -> tuple[npt.NDArray[np.int64], bool] | None:
    """The generalised assignment as a MIP over eligible pairs, or None without an answer."""
    orders, couriers = np.nonzero(problem.eligible)
    n, order_count = len(orders), problem.score.shape[0]
    worth = problem.worth()
    bonus = problem.bonus() * float(worth.mean())
    objective = -(problem.score[orders, couriers] + problem.bonus() * worth[orders])
    columns = np.arange(n)
    one_each = csr_array((np.ones(n), (orders, columns)), shape=(order_count, n))
    capacity = csr_array((problem.weights[orders], (couriers, columns)), shape=(len(problem.room), n))
    constraints = [
        LinearConstraint(one_each, -np.inf, 1.0),
        LinearConstraint(capacity, -np.inf, problem.room + _ROOM_SLACK),
    ]
    # |objective| is about served * (bonus + 1); this relative gap is an absolute one of about
    # 1e-4 per order: far below one served order, and a 1e-4 share of the score.
    gap = 1e-4 / (bonus + 1)
    result = milp(
        objective,
        integrality=np.ones(n),
        bounds=Bounds(0.0, 1.0),
        constraints=constraints,
        options={"time_limit": time_budget_s, "mip_rel_gap": gap, "presolve": True},
    )
    if result.x is None:
        return None
    chosen = np.flatnonzero(result.x > 0.5)
    courier = np.full(order_count, -1, dtype=np.int64)
    courier[orders[chosen]] = couriers[chosen]
    return courier, bool(result.status == 0)


def _feasible(problem: Problem, courier: npt.NDArray[np.int64]) -> bool:
    rows = np.flatnonzero(courier >= 0)
    if not problem.eligible[rows, courier[rows]].all():
        return False
    load = np.bincount(courier[rows], weights=problem.weights[rows], minlength=len(problem.room))
    return bool(np.all(load <= problem.room + 1e-6))


def solve(problem: Problem, time_budget_s: float = MIP_TIME_BUDGET_S) -> Solution:
    """The assignment serving the most orders, then with the highest total score.

    Args:
        problem: scores, eligibility, weights and rooms (deterministic for the same arrays).
        time_budget_s: wall time the MIP may use when weights differ.
    """
    best = _best_each(problem)
    if best is not None:
        return Solution(best, "best_each", True)
    if np.all(problem.weights == problem.weights[0]):
        return Solution(_assignment(problem), "assignment", True)
    first = repair(problem, greedy(problem))
    if int(problem.eligible.sum()) > MIP_MAX_PAIRS:
        return Solution(first, "greedy", False)
    found = _mip(problem, time_budget_s)
    if found is None or not _feasible(problem, found[0]):
        return Solution(first, "greedy", False)
    courier, optimal = found if found[1] else (repair(problem, found[0]), False)
    if value(problem, courier) < value(problem, first):
        return Solution(first, "greedy", False)
    return Solution(courier, "mip", optimal)
