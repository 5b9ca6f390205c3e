"""From pair scores to an answer: eligibility, the optimal assignment, top-K candidates with
their Pareto marks, and a reason for every order left unassigned.

The three objectives (on-time probability, distance, courier load balance) are scalarised by
the scorer's documented weights (``training.OBJECTIVE_WEIGHTS``); with positive weights the
best-scored courier of an order is always on that order's Pareto front, so the mark tells the
caller when capacity forced a dominated courier. Orders and couriers are put in id order
before solving, so the answer depends on the set given, not on the order it was listed in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ortserve.apps.dispatch.assignment import MIP_TIME_BUDGET_S, Method, Problem, solve

__all__ = [
    "DEADLINE_PASSED",
    "NO_CAPACITY",
    "NO_DEADLINE",
    "SERVICE_RADIUS_KM",
    "TAKEN",
    "Assignment",
    "PairScores",
    "decode",
    "pareto_front",
]

NO_CAPACITY = "no courier has room for the order's weight"
NO_DEADLINE = "no courier with room is on time with the requested probability (min_on_time)"
DEADLINE_PASSED = "the deadline has already passed"
TAKEN = "the couriers that could take it are full: serving it would leave more orders unserved"
SERVICE_RADIUS_KM = 50.0
"""An order farther than this from every courier is outside the service area: a courier
could not reach it in a delivery window, and its address was most likely read in the wrong
city. Its reason says so, with the distance, rather than "not on time"."""

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class PairScores:
    """[orders, couriers] arrays: the combined score and the objectives it weighs."""

    score: Floats
    on_time: Floats
    distance: Floats
    balance: Floats
    fits: npt.NDArray[np.bool_]
    """The order's weight fits the courier's remaining room on its own."""


@dataclass(frozen=True, slots=True)
class Assignment:
    """``courier[o]`` is the courier index of order o, or -1 with ``reason[o]`` saying why;
    ``candidates[o]`` are the top-K eligible couriers, ``pareto[o]`` their front marks."""

    courier: list[int]
    candidates: list[list[int]]
    pareto: list[list[bool]]
    reason: list[str | None]
    method: Method
    optimal: bool


def pareto_front(
    pairs: PairScores, eligible: npt.NDArray[np.bool_], picks: list[list[int]]
) -> list[list[bool]]:
    """Whether each picked courier of each order is undominated among the order's eligible
    couriers (no other is at least as good on all three objectives and better on one)."""
    width = max((len(p) for p in picks), default=0)
    if width == 0:
        return [[] for _ in picks]
    index = np.array([p + [0] * (width - len(p)) for p in picks], dtype=np.int64)
    rows = np.arange(len(picks))[:, None]
    at_least = np.ones((*index.shape, eligible.shape[1]), dtype=bool)
    better = np.zeros_like(at_least)
    for values, sign in ((pairs.on_time, 1.0), (pairs.distance, -1.0), (pairs.balance, 1.0)):
        mine = (sign * values[rows, index])[:, :, None]
        theirs = (sign * values)[:, None, :]
        at_least &= theirs >= mine
        better |= theirs > mine
    dominated = np.any(at_least & better & eligible[:, None, :], axis=2)
    return [[not d for d in row[: len(p)]] for row, p in zip(dominated.tolist(), picks, strict=True)]


def _top_k(
    score: Floats, eligible: npt.NDArray[np.bool_], rank: npt.NDArray[np.int64], top_k: int
) -> list[list[int]]:
    """Eligible couriers by descending score (ties: lower courier id), at most ``top_k``."""
    keys = (np.broadcast_to(rank, score.shape), -score, ~eligible)
    order = np.lexsort(keys, axis=-1)[:, :top_k]
    keep = np.take_along_axis(eligible, order, axis=-1)
    return [row[mask].tolist() for row, mask in zip(order, keep, strict=True)]


def _reason(
    o: int,
    courier: int,
    pairs: PairScores,
    expired: npt.NDArray[np.bool_],
    eligible: npt.NDArray[np.bool_],
    blocked: list[str | None],
) -> str | None:
    if courier >= 0:
        return None
    if expired[o]:
        return DEADLINE_PASSED
    if blocked[o] is not None:
        return blocked[o]
    nearest = float(pairs.distance[o].min()) if pairs.distance.shape[1] else 0.0
    if nearest > SERVICE_RADIUS_KM:
        return f"outside the service area: the nearest courier is {nearest:,.0f} km away"
    if not pairs.fits[o].any():
        return NO_CAPACITY
    if not eligible[o].any():
        return NO_DEADLINE
    return TAKEN


def decode(
    pairs: PairScores,
    weights: list[float],
    remaining: list[float],
    expired: list[bool],
    order_ids: list[str],
    courier_ids: list[str],
    top_k: int,
    min_on_time: float,
    time_budget_s: float = MIP_TIME_BUDGET_S,
    values: list[float] | None = None,
    blocked: list[str | None] | None = None,
) -> Assignment:
    """Assign each order at most once and no courier beyond its remaining capacity, serving the
    most order value (the most orders without values), then the highest total score.

    Args:
        pairs: the scorer's outputs per pair and whether the order fits the courier's room.
        weights: each order's weight; remaining: each courier's capacity minus its load.
        expired: orders whose deadline is already past (never eligible).
        order_ids, courier_ids: fix the solving order, so listing order does not matter.
        top_k: candidates returned per order (the assignment looks at every eligible pair).
        min_on_time: the on-time probability below which a courier is not eligible.
        values: each order's value (multiples of ``VALUE_STEP``), served first by total value;
            None serves the most orders.
        blocked: per order, why no courier may take it (a forbidden zone), or None; the
            reason is the order's in the answer.
    """
    expired_mask = np.asarray(expired, dtype=bool)
    blocked = blocked or [None] * len(order_ids)
    barred = np.array([b is not None for b in blocked], dtype=bool).reshape(-1)
    eligible = pairs.fits & (pairs.on_time >= min_on_time) & ~(expired_mask | barred)[:, None]
    by_order = np.argsort(np.asarray(order_ids), kind="stable")
    by_courier = np.argsort(np.asarray(courier_ids), kind="stable")
    problem = Problem(
        pairs.score[np.ix_(by_order, by_courier)],
        eligible[np.ix_(by_order, by_courier)],
        np.asarray(weights, dtype=np.float64)[by_order],
        np.asarray(remaining, dtype=np.float64)[by_courier],
        None if values is None else np.asarray(values, dtype=np.float64)[by_order],
    )
    solution = solve(problem, time_budget_s)
    courier = np.full(len(order_ids), -1, dtype=np.int64)
    served = solution.courier >= 0
    courier[by_order[served]] = by_courier[solution.courier[served]]
    rank = np.empty(len(courier_ids), dtype=np.int64)
    rank[by_courier] = np.arange(len(courier_ids))
    candidates = _top_k(pairs.score, eligible, rank, top_k)
    for o, c in enumerate(courier.tolist()):
        if c >= 0 and c not in candidates[o]:
            candidates[o].append(c)  # capacity forced a courier outside the top K: show it too
    pareto = pareto_front(pairs, eligible, candidates)
    reason = [_reason(o, int(c), pairs, expired_mask, eligible, blocked) for o, c in enumerate(courier)]
    return Assignment(courier.tolist(), candidates, pareto, reason, solution.method, solution.optimal)
