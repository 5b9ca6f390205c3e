"""Order x courier pair features: distance, geohash neighbourhood, time-window slack, load."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ortserve.apps.dispatch.geo import geohash, haversine_km, neighbourhood
from ortserve.apps.dispatch.request import DispatchRequest

__all__ = ["FEATURE_NAMES", "NOMINAL_KMH", "PairFeatures", "pair_features"]

NOMINAL_KMH = 15.0
"""Courier speed assumed for the slack feature (the model learns the real one)."""
FEATURE_NAMES = (
    "distance_10km",
    "slack_h",
    "load_ratio",
    "load_after_ratio",
    "same_neighbourhood",
    "weight_10",
)
"""Columns of the model input ``pairs``; distance in units of 10 km, weight in units of 10."""


@dataclass(frozen=True, slots=True)
class PairFeatures:
    """Row ``o * couriers + c`` is order o with courier c."""

    rows: npt.NDArray[np.float32]
    distance_km: npt.NDArray[np.float64]
    fits: npt.NDArray[np.bool_]
    """[orders, couriers]: the courier has room for the order's weight."""


def _neighbours(request: DispatchRequest) -> npt.NDArray[np.bool_]:
    cells = {cell: i for i, cell in enumerate({geohash(c.lat, c.lon) for c in request.couriers})}
    courier_cell = np.array([cells[geohash(c.lat, c.lon)] for c in request.couriers])
    near = np.zeros((len(request.orders), len(request.couriers)), dtype=bool)
    for row, order in enumerate(request.orders):
        around = [cells[cell] for cell in neighbourhood(order.lat, order.lon) if cell in cells]
        if around:
            near[row] = np.isin(courier_cell, around)
    return near


def pair_features(request: DispatchRequest) -> PairFeatures:
    """Every pair's features, vectorised over orders [O, 1] x couriers [1, C]."""
    orders, couriers = request.orders, request.couriers
    olat = np.array([[o.lat] for o in orders])
    olon = np.array([[o.lon] for o in orders])
    distance = haversine_km(
        olat, olon, np.array([[c.lat for c in couriers]]), np.array([[c.lon for c in couriers]])
    )
    minutes = np.array([[(o.deadline - request.now) / 60000.0] for o in orders])
    weight = np.array([[o.weight] for o in orders])
    capacity = np.array([[c.capacity for c in couriers]])
    load = np.array([[c.load for c in couriers]])
    columns = (
        distance / 10.0,
        (minutes - distance / NOMINAL_KMH * 60.0) / 60.0,
        np.broadcast_to(load / capacity, distance.shape),
        (load + weight) / capacity,
        _neighbours(request).astype(np.float64),
        np.broadcast_to(weight / 10.0, distance.shape),
    )
    rows = np.stack([np.asarray(c, dtype=np.float32).ravel() for c in columns], axis=1)
    return PairFeatures(rows, distance, (load + weight) <= capacity + 1e-9)
