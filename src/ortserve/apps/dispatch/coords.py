"""Chinese map coordinate systems to WGS84: GCJ-02 (national survey offset, used by AMap,
Tencent and Google in China) and BD-09 (Baidu's further offset of GCJ-02).

The GCJ-02 offset is a published closed-form distortion of WGS84 on the Krasovsky ellipsoid,
applied only inside China's bounding box. It has no closed-form inverse: the inverse here
iterates the forward map (a fixed point, to 1e-9 degrees in a few steps).
"""

from __future__ import annotations

import math
from typing import Literal

__all__ = [
    "COORD_SYSTEMS",
    "CoordSystem",
    "bd09_to_gcj02",
    "gcj02_to_bd09",
    "gcj02_to_wgs84",
    "to_wgs84",
    "wgs84_to_gcj02",
]

CoordSystem = Literal["wgs84", "gcj02", "bd09"]
COORD_SYSTEMS: tuple[CoordSystem, ...] = ("wgs84", "gcj02", "bd09")

_A = 6378245.0
"""Krasovsky 1940 semi-major axis (m)."""
_EE = 0.00669342162296594323
"""Its first eccentricity squared."""
_BD_K = math.pi * 3000.0 / 180.0


def _outside_china(lat: float, lon: float) -> bool:
    return not (73.66 < lon < 135.05 and 3.86 < lat < 53.55)


def _offset_lat(x: float, y: float) -> float:
    value = -100.0 + 2.0 * x + 3.0 * y + 0.2 * y * y + 0.1 * x * y + 0.2 * math.sqrt(abs(x))
    value += (20.0 * math.sin(6.0 * x * math.pi) + 20.0 * math.sin(2.0 * x * math.pi)) * 2.0 / 3.0
    value += (20.0 * math.sin(y * math.pi) + 40.0 * math.sin(y / 3.0 * math.pi)) * 2.0 / 3.0
    return value + (160.0 * math.sin(y / 12.0 * math.pi) + 320.0 * math.sin(y * math.pi / 30.0)) * 2.0 / 3.0


def _offset_lon(x: float, y: float) -> float:
    value = 300.0 + x + 2.0 * y + 0.1 * x * x + 0.1 * x * y + 0.1 * math.sqrt(abs(x))
    value += (20.0 * math.sin(6.0 * x * math.pi) + 20.0 * math.sin(2.0 * x * math.pi)) * 2.0 / 3.0
    value += (20.0 * math.sin(x * math.pi) + 40.0 * math.sin(x / 3.0 * math.pi)) * 2.0 / 3.0
    return value + (150.0 * math.sin(x / 12.0 * math.pi) + 300.0 * math.sin(x / 30.0 * math.pi)) * 2.0 / 3.0


def wgs84_to_gcj02(lat: float, lon: float) -> tuple[float, float]:
    """(lat, lon) in GCJ-02; points outside China are unchanged."""
    if _outside_china(lat, lon):
        return lat, lon
    dlat = _offset_lat(lon - 105.0, lat - 35.0)
    dlon = _offset_lon(lon - 105.0, lat - 35.0)
    radians = lat / 180.0 * math.pi
    magic = 1 - _EE * math.sin(radians) ** 2
    root = math.sqrt(magic)
    dlat = dlat * 180.0 / ((_A * (1 - _EE)) / (magic * root) * math.pi)
    dlon = dlon * 180.0 / (_A / root * math.cos(radians) * math.pi)
    return lat + dlat, lon + dlon


def gcj02_to_wgs84(lat: float, lon: float, tolerance: float = 1e-9) -> tuple[float, float]:
    """The WGS84 point whose GCJ-02 image is (lat, lon), by fixed-point iteration."""
    guess_lat, guess_lon = lat, lon
    for _ in range(30):
        image_lat, image_lon = wgs84_to_gcj02(guess_lat, guess_lon)
        error_lat, error_lon = image_lat - lat, image_lon - lon
        if abs(error_lat) < tolerance and abs(error_lon) < tolerance:
            break
        guess_lat, guess_lon = guess_lat - error_lat, guess_lon - error_lon
    return guess_lat, guess_lon


def gcj02_to_bd09(lat: float, lon: float) -> tuple[float, float]:
    """(lat, lon) in Baidu's BD-09."""
    z = math.hypot(lon, lat) + 0.00002 * math.sin(lat * _BD_K)
    theta = math.atan2(lat, lon) + 0.000003 * math.cos(lon * _BD_K)
    return z * math.sin(theta) + 0.006, z * math.cos(theta) + 0.0065


def bd09_to_gcj02(lat: float, lon: float) -> tuple[float, float]:
    """(lat, lon) in GCJ-02 from BD-09 (the published closed-form inverse)."""
    x, y = lon - 0.0065, lat - 0.006
    z = math.hypot(x, y) - 0.00002 * math.sin(y * _BD_K)
    theta = math.atan2(y, x) - 0.000003 * math.cos(x * _BD_K)
    return z * math.sin(theta), z * math.cos(theta)


def to_wgs84(lat: float, lon: float, system: CoordSystem) -> tuple[float, float]:
    """A position given in ``system`` as WGS84, the frame distances are computed in."""
    if system == "gcj02":
        return gcj02_to_wgs84(lat, lon)
    if system == "bd09":
        return gcj02_to_wgs84(*bd09_to_gcj02(lat, lon))
    return lat, lon
