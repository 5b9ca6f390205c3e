"""Distances and neighbourhoods on the globe: haversine and geohash (with its 3x3 neighbours)."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

__all__ = [
    "EARTH_RADIUS_KM",
    "geohash",
    "geohash_cells",
    "haversine_km",
    "neighbourhood",
    "same_neighbourhood",
]

EARTH_RADIUS_KM = 6371.0088
_BASE32 = "0123456789bcdefghjkmnpqrstuvwxyz"
Floats = npt.NDArray[np.float64]


def haversine_km(lat1: Floats, lon1: Floats, lat2: Floats, lon2: Floats) -> Floats:
    """Great-circle distance in km; broadcasts like NumPy (orders [O,1] x couriers [1,C])."""
    p1, p2 = np.radians(lat1), np.radians(lat2)
    dp, dl = p2 - p1, np.radians(lon2 - lon1)
    a = np.sin(dp / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(dl / 2) ** 2
    return np.asarray(2 * EARTH_RADIUS_KM * np.arcsin(np.sqrt(np.clip(a, 0.0, 1.0))))


def geohash(lat: float, lon: float, precision: int = 7) -> str:
    """The standard base-32 geohash; precision 7 cells are about 153 m x 153 m."""
    lat_range, lon_range = [-90.0, 90.0], [-180.0, 180.0]
    chars: list[str] = []
    bits, value, even = 0, 0, True
    while len(chars) < precision:
        span, coordinate = (lon_range, lon) if even else (lat_range, lat)
        middle = (span[0] + span[1]) / 2
        value = value * 2 + (coordinate >= middle)
        span[0 if coordinate >= middle else 1] = middle
        even = not even
        bits += 1
        if bits == 5:
            chars.append(_BASE32[value])
            bits, value = 0, 0
    return "".join(chars)


def _cell_size(precision: int) -> tuple[float, float]:
    lon_bits = math.ceil(precision * 5 / 2)
    lat_bits = precision * 5 // 2
    return 180.0 / 2**lat_bits, 360.0 / 2**lon_bits


def neighbourhood(lat: float, lon: float, precision: int = 7) -> frozenset[str]:
    """The cell of a point and its eight neighbours (clamped at the poles, wrapped at 180)."""
    dlat, dlon = _cell_size(precision)
    cells = set()
    for i in (-1, 0, 1):
        for j in (-1, 0, 1):
            nlat = min(max(lat + i * dlat, -89.999999), 89.999999)
            nlon = (lon + j * dlon + 180.0) % 360.0 - 180.0
            cells.add(geohash(nlat, nlon, precision))
    return frozenset(cells)


def geohash_cells(
    lat: Floats, lon: Floats, precision: int = 7
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Row and column of each point's geohash cell: the geohash is these two indices' bits
    interleaved, so cells are neighbours exactly when both indices differ by at most one."""
    lon_bits = math.ceil(precision * 5 / 2)
    lat_bits = precision * 5 // 2
    rows = np.floor((np.asarray(lat) + 90.0) / 180.0 * 2**lat_bits).astype(np.int64)
    cols = np.floor((np.asarray(lon) + 180.0) / 360.0 * 2**lon_bits).astype(np.int64)
    return np.minimum(rows, 2**lat_bits - 1), np.minimum(cols, 2**lon_bits - 1)


def same_neighbourhood(
    lat1: Floats, lon1: Floats, lat2: Floats, lon2: Floats, precision: int = 7
) -> npt.NDArray[np.bool_]:
    """Whether point 2 lies in point 1's 3x3 geohash neighbourhood; broadcasts like NumPy."""
    row1, col1 = geohash_cells(lat1, lon1, precision)
    row2, col2 = geohash_cells(lat2, lon2, precision)
    columns = 2 ** math.ceil(precision * 5 / 2)
    dcol = np.abs(col1 - col2)
    return np.asarray((np.abs(row1 - row2) <= 1) & (np.minimum(dcol, columns - dcol) <= 1))
