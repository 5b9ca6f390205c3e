"""Order x courier pair features: distance, geohash neighbourhood, time-window slack, load."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ortserve.apps.dispatch.constraints import travel_minutes, zone_effects
from ortserve.apps.dispatch.geo import haversine_km, same_neighbourhood
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
    blocked: tuple[str | None, ...] = ()
    """Per order: why no courier may take it (a forbidden no-stopping zone), or None."""
    applied: tuple[tuple[str, ...], ...] = ()
    """Per order: the names of the request's constraints that lengthened its trip or walk."""


def _applied(
    request: DispatchRequest, trip_km: npt.NDArray[np.float64], zones: tuple[tuple[str, ...], ...]
) -> tuple[tuple[str, ...], ...]:
    """Each order's constraints that cost it time: its zones, and the peaks its longest trip
    meets (every trip leaves now, so the longest overlaps whatever window a shorter one does)."""
    longest = trip_km.max(axis=1)
    nominal = longest / NOMINAL_KMH * 60.0
    met = [
        (peak.name, travel_minutes(longest, NOMINAL_KMH, (peak,), request.now) > nominal + 1e-6)
        for peak in request.constraints.peaks
    ]
    return tuple(tuple(name for name, slowed in met if slowed[o]) + named for o, named in enumerate(zones))


def pair_features(request: DispatchRequest) -> PairFeatures:
    """Every pair's features, vectorised over orders [O, 1] x couriers [1, C]."""
    orders, couriers = request.orders, request.couriers
    olat = np.array([[o.lat] for o in orders])
    olon = np.array([[o.lon] for o in orders])
    clat = np.array([[c.lat for c in couriers]])
    clon = np.array([[c.lon for c in couriers]])
    distance = haversine_km(olat, olon, clat, clon)
    minutes = np.array([[(o.deadline - request.now) / 60000.0] for o in orders])
    # An address placed only to its area, district or city may lie that far from its point: the
    # time slack counts the worst case, so an imprecise order is less surely on time.
    uncertain = np.array([[o.uncertainty_km] for o in orders])
    weight = np.array([[o.weight] for o in orders])
    capacity = np.array([[c.capacity for c in couriers]])
    load = np.array([[c.load for c in couriers]])
    # A rush-hour peak slows the part of the trip inside its window; an order in a
    # no-stopping zone costs the walk from outside it. Both shorten the slack the scorer reads.
    constraints = request.constraints
    trip = distance + uncertain
    slack = minutes - travel_minutes(trip, NOMINAL_KMH, constraints.peaks, request.now)
    zones = zone_effects(olat, olon, constraints.zones) if constraints.zones else None
    if zones is not None:
        slack -= zones.walk_minutes[:, None]
    columns = (
        distance / 10.0,
        slack / 60.0,
        np.broadcast_to(load / capacity, distance.shape),
        (load + weight) / capacity,
        same_neighbourhood(olat, olon, clat, clon).astype(np.float64),
        np.broadcast_to(weight / 10.0, distance.shape),
    )
    rows = np.stack([np.asarray(c, dtype=np.float32).ravel() for c in columns], axis=1)
    fits = (load + weight) <= capacity + 1e-9
    if zones is None and not constraints.peaks:
        return PairFeatures(rows, distance, fits)
    names = zones.names if zones is not None else ((),) * len(orders)
    blocked = zones.blocked if zones is not None else ()
    return PairFeatures(rows, distance, fits, blocked, _applied(request, trip, names))
