"""Constraint tags of a dispatch request: rush-hour peaks and no-stopping zones as feasibility rules.

A peak (``{"kind": "peak", "start": "11:00", "end": "13:30", "speed_factor": 0.6}``, China time)
slows travel while its window lasts; a no-stopping zone (``{"kind": "no_stopping", "polygon":
[[lat, lon], ...], "walk_minutes": 5}``) makes the courier stop outside and walk, and one marked
``"forbidden": true`` cannot be delivered into at all. Both act on the time slack the scorer
reads (``features.pair_features``), so the on-time estimate, eligibility and assignment follow.
Everything here is bounded: a client's constraints cost at most 16 x 64 polygon edges per order.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ortserve.errors import InvalidInput

__all__ = [
    "CHINA_UTC_OFFSET_MIN",
    "MAX_CONSTRAINTS",
    "MAX_VERTICES",
    "Constraints",
    "Peak",
    "Zone",
    "ZoneEffects",
    "inside_polygon",
    "parse_constraints",
    "travel_minutes",
    "zone_effects",
]

MAX_CONSTRAINTS = 16
MAX_VERTICES = 64
MAX_WALK_MINUTES = 120.0
MIN_SPEED_FACTOR = 0.1
"""A slower factor would turn a 5 km trip into hours: a client's typo, not a rush hour."""
CHINA_UTC_OFFSET_MIN = 8 * 60
"""Peak windows are read in China Standard Time (UTC+8, no daylight saving)."""
HORIZON_MIN = 3 * 24 * 60
"""Peaks are laid out over the next three days; travel beyond that runs at the nominal speed
(no order still hoping to be on time is that far away)."""
_DAY = 24 * 60
_CLOCK = re.compile(r"^([01]\d|2[0-4]):([0-5]\d)$")
_PEAK = frozenset({"kind", "name", "start", "end", "speed_factor"})
_ZONE = frozenset({"kind", "name", "polygon", "walk_minutes", "forbidden"})
Floats = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Peak:
    """Travel between ``start`` and ``end`` (minutes of the day, China time; ``end <= start``
    crosses midnight) goes at ``speed_factor`` times the usual speed."""

    name: str
    start: int
    end: int
    speed_factor: float


@dataclass(frozen=True, slots=True)
class Zone:
    """A polygon (vertex latitudes and longitudes) an order inside of which costs the courier
    ``walk_minutes`` on foot, or cannot be delivered at all when ``forbidden``."""

    name: str
    lats: tuple[float, ...]
    lons: tuple[float, ...]
    walk_minutes: float
    forbidden: bool


@dataclass(frozen=True, slots=True)
class Constraints:
    """A request's peaks and zones (none by default)."""

    peaks: tuple[Peak, ...] = ()
    zones: tuple[Zone, ...] = ()


def _field_number(item: dict[str, object], key: str, field: str, low: float, high: float) -> float:
    value = item.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInput(f"field '{field}.{key}' must be a finite number")
    if not low <= value <= high:
        raise InvalidInput(f"field '{field}.{key}' must be from {low:g} to {high:g}")
    return float(value)


def _clock(item: dict[str, object], key: str, field: str) -> int:
    value = item.get(key)
    match = _CLOCK.match(value) if isinstance(value, str) else None
    minutes = int(match.group(1)) * 60 + int(match.group(2)) if match else -1
    if not 0 <= minutes <= _DAY:
        raise InvalidInput(
            f"field '{field}.{key}' must be a time of day 'HH:MM' (China time, 00:00 to 24:00)"
        )
    return minutes


def _name(item: dict[str, object], field: str) -> str:
    value = item.get("name", field)
    if not isinstance(value, str) or not 0 < len(value) <= 64:
        raise InvalidInput(f"field '{field}.name' must be a string of 1 to 64 characters")
    return value


def _peak(item: dict[str, object], field: str) -> Peak:
    start, end = _clock(item, "start", field), _clock(item, "end", field)
    if start % _DAY == end % _DAY:
        raise InvalidInput(f"field '{field}.end' must differ from '{field}.start'")
    factor = _field_number(item, "speed_factor", field, MIN_SPEED_FACTOR, 1.0)
    return Peak(_name(item, field), start % _DAY, end % _DAY, factor)


def _vertex(value: object, field: str) -> tuple[float, float]:
    if not isinstance(value, list) or len(value) != 2:
        raise InvalidInput(f"field {field!r} must be a [lat, lon] pair")
    lat, lon = value
    for number in value:
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
            raise InvalidInput(f"field {field!r} must hold finite numbers")
    if not (-90 <= lat <= 90 and -180 <= lon <= 180):
        raise InvalidInput(f"field {field!r} is not a position on Earth")
    return float(lat), float(lon)


def _zone(item: dict[str, object], field: str) -> Zone:
    polygon = item.get("polygon")
    if not isinstance(polygon, list) or not 3 <= len(polygon) <= MAX_VERTICES:
        raise InvalidInput(
            f"field '{field}.polygon' must be a list of 3 to {MAX_VERTICES} [lat, lon] vertices"
        )
    vertices = [_vertex(v, f"{field}.polygon[{i}]") for i, v in enumerate(polygon)]
    walk = (
        _field_number(item, "walk_minutes", field, 0.0, MAX_WALK_MINUTES) if "walk_minutes" in item else 0.0
    )
    forbidden = item.get("forbidden", False)
    if not isinstance(forbidden, bool):
        raise InvalidInput(f"field '{field}.forbidden' must be true or false")
    lats, lons = zip(*vertices, strict=True)
    return Zone(_name(item, field), lats, lons, walk, forbidden)


def parse_constraints(value: object) -> Constraints:
    """The request's ``constraints`` list, validated strictly (absent: none).

    Raises:
        InvalidInput: naming the field: more than ``MAX_CONSTRAINTS`` entries, an unknown kind
            or field, a bad time, factor, vertex or walk.
    """
    if value is None:
        return Constraints()
    if not isinstance(value, list) or len(value) > MAX_CONSTRAINTS:
        raise InvalidInput(f"field 'constraints' must be a list of at most {MAX_CONSTRAINTS} entries")
    peaks: list[Peak] = []
    zones: list[Zone] = []
    for i, item in enumerate(value):
        field = f"constraints[{i}]"
        if not isinstance(item, dict):
            raise InvalidInput(f"field {field!r} must be an object")
        kind = item.get("kind")
        if kind not in ("peak", "no_stopping"):
            raise InvalidInput(f"field '{field}.kind' must be 'peak' or 'no_stopping'")
        allowed = _PEAK if kind == "peak" else _ZONE
        unknown = sorted(str(key) for key in item if key not in allowed)
        if unknown:
            raise InvalidInput(f"field '{field}.{unknown[0][:64]}' is unknown; allowed: {sorted(allowed)}")
        if kind == "peak":
            peaks.append(_peak(item, field))
        else:
            zones.append(_zone(item, field))
    return Constraints(tuple(peaks), tuple(zones))


def inside_polygon(lat: Floats, lon: Floats, zone: Zone) -> npt.NDArray[np.bool_]:
    """Whether each point lies inside the zone (even-odd rule, every edge against every point
    at once). Planar in degrees, which is exact enough for a city-sized zone away from the
    antimeridian; a point exactly on an edge may fall either way."""
    y0, x0 = np.asarray(zone.lats)[None, :], np.asarray(zone.lons)[None, :]
    y1, x1 = np.roll(y0, -1, axis=1), np.roll(x0, -1, axis=1)
    y, x = np.asarray(lat, dtype=np.float64).reshape(-1, 1), np.asarray(lon, dtype=np.float64).reshape(-1, 1)
    straddles = (y0 > y) != (y1 > y)
    with np.errstate(divide="ignore", invalid="ignore"):
        crossing_x = x0 + (y - y0) * (x1 - x0) / (y1 - y0)
    crosses = straddles & (x < crossing_x)
    return np.asarray(np.count_nonzero(crosses, axis=1) % 2 == 1)


@dataclass(frozen=True, slots=True)
class ZoneEffects:
    """Per order: the walk its zones cost, why it cannot be delivered (or None), the zones it is in."""

    walk_minutes: Floats
    blocked: tuple[str | None, ...]
    names: tuple[tuple[str, ...], ...]


def zone_effects(lat: Floats, lon: Floats, zones: tuple[Zone, ...]) -> ZoneEffects:
    """Each order's zones: it pays the longest walk of those it lies in (the courier stops once,
    outside all of them), and the first forbidden one names why no courier may take it."""
    count = len(np.asarray(lat).reshape(-1))
    walk = np.zeros(count)
    blocked: list[str | None] = [None] * count
    names: list[list[str]] = [[] for _ in range(count)]
    for zone in zones:
        inside = inside_polygon(lat, lon, zone)
        walk = np.where(inside, np.maximum(walk, zone.walk_minutes), walk)
        for o in np.flatnonzero(inside).tolist():
            names[o].append(zone.name)
            if zone.forbidden and blocked[o] is None:
                blocked[o] = f"inside the no-stopping zone {zone.name!r}, where no courier may deliver"
    return ZoneEffects(walk, tuple(blocked), tuple(tuple(n) for n in names))


def _speed_profile(peaks: tuple[Peak, ...], now_ms: int) -> tuple[Floats, Floats]:
    """Segment starts (minutes from now) and each segment's speed factor over the horizon; the
    last segment runs at factor 1 for ever. Overlapping peaks: the slowest holds."""
    day_minute = (now_ms / 60_000.0 + CHINA_UTC_OFFSET_MIN) % _DAY
    windows: list[tuple[float, float, float]] = []
    for peak in peaks:
        length = (peak.end - peak.start) % _DAY
        for day in range(-1, HORIZON_MIN // _DAY + 1):
            start = peak.start + day * _DAY - day_minute
            windows.append((start, start + length, peak.speed_factor))
    edges = {0.0, float(HORIZON_MIN)}
    edges.update(t for w in windows for t in w[:2] if 0.0 < t < HORIZON_MIN)
    starts = np.array(sorted(edges))
    middles = (starts[:-1] + starts[1:]) / 2
    factor = np.ones(len(starts))
    for start, end, speed in windows:
        covered = np.append((middles > start) & (middles < end), False)
        factor[covered] = np.minimum(factor[covered], speed)
    return starts, factor


def travel_minutes(distance_km: Floats, kmh: float, peaks: tuple[Peak, ...], now_ms: int) -> Floats:
    """Minutes to cover each distance leaving at ``now_ms``, at ``kmh`` times the speed factor
    of the moment (piecewise constant, so exact: the distance covered by each segment's start,
    then the rest at that segment's speed)."""
    if not peaks:
        return np.asarray(distance_km / kmh * 60.0)
    starts, factor = _speed_profile(peaks, now_ms)
    per_minute = kmh / 60.0 * factor
    covered = np.concatenate(([0.0], np.cumsum(np.diff(starts) * per_minute[:-1])))
    segment = np.searchsorted(covered, distance_km, side="right") - 1
    return np.asarray(starts[segment] + (distance_km - covered[segment]) / per_minute[segment])
