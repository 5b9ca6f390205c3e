"""From pair scores to an assignment: top-K candidates per order, then capacity-aware conflict
resolution over all orders (greedy by score, deterministic tie-breaks)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["MIN_ON_TIME", "Assignment", "decode"]

MIN_ON_TIME = 0.05
"""A courier whose on-time probability for an order is below this is no candidate for it."""
NO_CAPACITY = "no courier has room for the order's weight"
NO_DEADLINE = "no courier with room can deliver it before the deadline"
TAKEN = "every top-K candidate was filled by higher-scoring orders"


@dataclass(frozen=True, slots=True)
class Assignment:
    """``courier[o]`` is the courier index of order o, or -1 with ``reason[o]`` saying why."""

    courier: list[int]
    candidates: list[list[int]]
    reason: list[str | None]


def _candidates(
    score: npt.NDArray[np.float32], eligible: npt.NDArray[np.bool_], courier_ids: list[str], top_k: int
) -> list[list[int]]:
    # One lexsort for all orders: eligible first, then score descending, then courier id.
    id_rank = np.empty(len(courier_ids), dtype=np.int64)
    id_rank[sorted(range(len(courier_ids)), key=courier_ids.__getitem__)] = np.arange(len(courier_ids))
    keys = (np.broadcast_to(id_rank, score.shape), -score, ~eligible)
    order = np.lexsort(keys, axis=-1)[:, :top_k]
    keep = np.take_along_axis(eligible, order, axis=-1)
    return [row[mask].tolist() for row, mask in zip(order, keep, strict=True)]


def decode(
    score: npt.NDArray[np.float32],
    on_time: npt.NDArray[np.float32],
    fits: npt.NDArray[np.bool_],
    weights: list[float],
    remaining: list[float],
    order_ids: list[str],
    courier_ids: list[str],
    top_k: int,
) -> Assignment:
    """Assign each order at most once and no courier beyond its remaining capacity.

    Args:
        score, on_time, fits: [orders, couriers] model score, on-time probability, and whether
            the order fits the courier's remaining capacity on its own.
        weights: each order's weight; remaining: each courier's capacity minus its load.
        order_ids, courier_ids: used for deterministic tie-breaks (score, order id, courier id).
        top_k: candidates kept per order.
    """
    eligible = fits & (on_time >= MIN_ON_TIME)
    candidates = _candidates(score, eligible, courier_ids, top_k)
    pairs = sorted(
        (
            (-float(score[o, c]), order_ids[o], courier_ids[c], o, c)
            for o, cs in enumerate(candidates)
            for c in cs
        )
    )
    room = list(remaining)
    courier = [-1] * len(order_ids)
    for _, _, _, o, c in pairs:
        if courier[o] == -1 and room[c] + 1e-9 >= weights[o]:
            courier[o] = c
            room[c] -= weights[o]
    reason: list[str | None] = []
    for o, c in enumerate(courier):
        if c != -1:
            reason.append(None)
        elif not fits[o].any():
            reason.append(NO_CAPACITY)
        elif not candidates[o]:
            reason.append(NO_DEADLINE)
        else:
            reason.append(TAKEN)
    return Assignment(courier, candidates, reason)
