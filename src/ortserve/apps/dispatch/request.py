"""The ``POST /v1/route`` body, validated strictly: every error names its field."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ortserve.apps.dispatch.constraints import Constraints, parse_constraints
from ortserve.apps.dispatch.coords import COORD_SYSTEMS, CoordSystem, to_wgs84
from ortserve.apps.dispatch.gazetteer import Place, place_address
from ortserve.errors import InvalidInput, PayloadTooLarge

__all__ = [
    "DEFAULT_MIN_ON_TIME",
    "DEFAULT_TOP_K",
    "MAX_COURIERS",
    "MAX_ORDERS",
    "MAX_PAIRS",
    "Courier",
    "DispatchRequest",
    "Order",
    "Rejected",
    "parse_dispatch_request",
]

MAX_ORDERS = 1000
MAX_COURIERS = 400
MAX_PAIRS = 100_000
"""Orders x couriers scored per request at most (500 x 200); beyond it, 413."""
MAX_TOP_K = 10
DEFAULT_TOP_K = 5
DEFAULT_MIN_ON_TIME = 0.5
"""A courier is eligible for an order only when its on-time probability reaches this; a
request may ask for another floor with ``min_on_time`` (0 to 1)."""
_TOP = frozenset(
    {
        "orders",
        "couriers",
        "now",
        "top_k",
        "min_on_time",
        "coord_system",
        "pareto",
        "constraints",
        "user_id",
        "ab_tag",
    }
)
"""``user_id`` and ``ab_tag`` are routing's (docs/traffic.md): accepted and ignored here when the model
has no routing policy to strip them."""
MAX_ADDRESS = 512
"""Characters of an order's address; real ones are tens."""
_ORDER = frozenset({"id", "lat", "lon", "address", "created_at", "deadline", "weight", "value"})
MAX_VALUE = 10_000.0
"""An order's value at most; values are rounded to ``assignment.VALUE_STEP`` (0.01)."""
MAX_IGNORED = 8
"""Unknown fields named per order at most (each cut to 64 characters): the answer stays small
whatever a client sends."""
_COURIER = frozenset({"id", "lat", "lon", "capacity", "load"})


@dataclass(frozen=True, slots=True)
class Order:
    """A parcel to deliver: where, its time window (Unix ms) and weight."""

    id: str
    lat: float
    lon: float
    created_at: int
    deadline: int
    weight: float
    placed_by: str | None
    """The district or city the address parser placed it in, when coordinates were missing."""
    address: str | None = None
    """The address it was given by, if any (a geocoding service may refine the position)."""
    geocoded: bool = False
    """The position came from the geocoding service rather than the gazetteer."""
    place: Place | None = None
    """The gazetteer's reading of the address (road, house number, precision), if any."""

    @property
    def uncertainty_km(self) -> float:
        """How far the real address may lie from the position: 0 for given coordinates or a
        geocoding service's answer, else by the gazetteer's precision."""
        return 0.0 if self.place is None or self.geocoded else self.place.uncertainty_km

    value: float = 1.0
    """What serving it is worth against the other orders: the assignment serves the most value
    first (a heavy order of value 3 before two light ones of 1)."""
    ignored: tuple[str, ...] = ()
    """Fields of the order this server does not know: ignored, and named in its answer."""


@dataclass(frozen=True, slots=True)
class Courier:
    """A courier: position, capacity and current load (same unit as order weights)."""

    id: str
    lat: float
    lon: float
    capacity: float
    load: float


@dataclass(frozen=True, slots=True)
class Rejected:
    """An order the request named but that cannot be routed, and why (a field error)."""

    id: str
    reason: str
    pending: Order | None = None
    """Only its address could not be placed: the order as it would be, for a geocoding service
    to place (its lat/lon are NaN until then)."""


@dataclass(frozen=True, slots=True)
class DispatchRequest:
    """Valid orders, the orders rejected one by one, couriers, and the request's settings."""

    orders: tuple[Order, ...]
    rejected: tuple[Rejected, ...]
    couriers: tuple[Courier, ...]
    now: int
    top_k: int
    min_on_time: float
    pareto_filter: bool = False
    """``pareto: "filter"``: candidates off the Pareto front are left out (the assigned courier
    stays, marked); the default ``"mark"`` lists them with ``pareto: false``."""
    constraints: Constraints = dataclasses.field(default_factory=Constraints)
    """Rush-hour peaks and no-stopping zones (``constraints.py``): they lengthen the trips and
    walks the on-time estimate counts, and a forbidden zone's orders go to no courier."""


def _name(field: str, key: str) -> str:
    return f"{field}.{key}" if field else key


def _object(value: object, field: str, allowed: frozenset[str]) -> dict[str, object]:
    if not isinstance(value, dict):
        raise InvalidInput(f"field {field or '(body)'!r} must be an object")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise InvalidInput(f"field '{_name(field, unknown[0])}' is unknown; allowed: {sorted(allowed)}")
    return value


def _number(item: dict[str, object], key: str, field: str, default: float | None = None) -> float:
    if key not in item:
        if default is None:
            raise InvalidInput(f"field '{_name(field, key)}' is required")
        return default
    value = item[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInput(f"field '{_name(field, key)}' must be a finite number")
    return float(value)


def _integer(item: dict[str, object], key: str, field: str) -> int:
    if key not in item:
        raise InvalidInput(f"field '{_name(field, key)}' is required")
    value = item[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"field '{_name(field, key)}' must be an integer (Unix milliseconds)")
    return value


def _identifier(item: dict[str, object], field: str, seen: set[str]) -> str:
    value = item.get("id")
    if not isinstance(value, str) or not 0 < len(value) <= 64:
        raise InvalidInput(f"field '{field}.id' must be a string of 1 to 64 characters")
    if value in seen:
        raise _Duplicate(f"field '{field}.id': {value!r} appears twice; only its first order is routed")
    seen.add(value)
    return value


class _Duplicate(InvalidInput):
    """An id given twice: a courier's fails the request, an order's only that order."""


@dataclass(frozen=True, slots=True)
class _Frame:
    """How positions are read: the coordinate system of ``lat``/``lon`` and, for addresses, the
    point that decides between same-named districts (the couriers' centre)."""

    system: CoordSystem
    near: tuple[float, float] | None = None


def _position(item: dict[str, object], field: str, frame: _Frame) -> tuple[float, float, Place | None]:
    if "lat" in item or "lon" in item:
        lat, lon = _number(item, "lat", field), _number(item, "lon", field)
        if not (-90 <= lat <= 90 and -180 <= lon <= 180):
            raise InvalidInput(f"field '{field}.lat'/'{field}.lon' is not a position on Earth")
        return (*to_wgs84(lat, lon, frame.system), None)
    address = item.get("address")
    if not isinstance(address, str) or not address.strip():
        raise InvalidInput(f"field '{field}' needs 'lat' and 'lon' or a non-empty 'address'")
    place = place_address(address, f"{field}.address", frame.near)
    return place.lat, place.lon, place


def _order(value: object, field: str, seen: set[str], frame: _Frame) -> Order | Rejected:
    """A malformed order that still has a usable id is rejected alone; without one, nothing
    could name it in the answer, so the request fails."""
    if not isinstance(value, dict):
        raise InvalidInput(f"field {field!r} must be an object")
    try:
        identifier = _identifier(value, field, seen)
    except _Duplicate as error:
        return Rejected(str(value["id"]), str(error))
    try:
        return _valid_order(value, field, identifier, frame)
    except InvalidInput as error:
        return Rejected(identifier, str(error))


def _valid_order(item: dict[str, object], field: str, identifier: str, frame: _Frame) -> Order | Rejected:
    # A field this server does not know (a client's own "priority", say) costs the order
    # nothing: it is ignored and named in the order's answer.
    ignored = tuple(sorted(str(key) for key in item if key not in _ORDER))[:MAX_IGNORED]
    address = item.get("address")
    if isinstance(address, str) and len(address) > MAX_ADDRESS:
        # The gazetteer scans the whole text for every name it knows: a million characters
        # held the event loop a second per order.
        raise InvalidInput(f"field '{field}.address' is longer than {MAX_ADDRESS} characters")
    unplaced: InvalidInput | None = None
    try:
        lat, lon, place = _position(item, field, frame)
    except InvalidInput as error:
        if "lat" in item or "lon" in item or not isinstance(item.get("address"), str):
            raise
        lat, lon, place, unplaced = math.nan, math.nan, None, error
    created, deadline = _integer(item, "created_at", field), _integer(item, "deadline", field)
    if deadline <= created:
        raise InvalidInput(f"field '{field}.deadline' must be after '{field}.created_at'")
    weight = _number(item, "weight", field, 1.0)
    if weight <= 0:
        raise InvalidInput(f"field '{field}.weight' must be positive")
    value = round(_number(item, "value", field, 1.0), 2)
    if not 0.01 <= value <= MAX_VALUE:
        raise InvalidInput(f"field '{field}.value' must be from 0.01 to {MAX_VALUE:,.0f}")
    address = item.get("address") if place or unplaced else None
    order = Order(
        identifier,
        lat,
        lon,
        created,
        deadline,
        weight,
        place.district or place.city if place else None,
        address if isinstance(address, str) else None,
        place=place,
        value=value,
        ignored=tuple(name[:64] for name in ignored),
    )
    return order if unplaced is None else Rejected(identifier, str(unplaced), order)


def _courier(value: object, field: str, seen: set[str], frame: _Frame) -> Courier:
    item = _object(value, field, _COURIER)
    identifier = _identifier(item, field, seen)
    if "lat" not in item or "lon" not in item:
        raise InvalidInput(f"field '{field}.lat' and '{field}.lon' are required")
    lat, lon, _ = _position(item, field, frame)
    capacity = _number(item, "capacity", field)
    load = _number(item, "load", field, 0.0)
    if capacity <= 0 or load < 0:
        raise InvalidInput(f"field '{field}.capacity' must be positive and '{field}.load' non-negative")
    return Courier(identifier, lat, lon, capacity, load)


def _list(document: dict[str, object], key: str, limit: int) -> list[object]:
    value = document.get(key)
    if not isinstance(value, list) or not value:
        raise InvalidInput(f"field {key!r} must be a non-empty list")
    if len(value) > limit:
        raise InvalidInput(f"field {key!r} has {len(value)} entries; at most {limit} are allowed")
    return value


def _settings(top: dict[str, object], default_now: int) -> tuple[int, int, float]:
    now = _integer(top, "now", "") if "now" in top else default_now
    top_k = int(_number(top, "top_k", "", DEFAULT_TOP_K))
    if top.get("top_k", DEFAULT_TOP_K) != top_k or not 1 <= top_k <= MAX_TOP_K:
        raise InvalidInput(f"field 'top_k' must be an integer from 1 to {MAX_TOP_K}")
    min_on_time = _number(top, "min_on_time", "", DEFAULT_MIN_ON_TIME)
    if not 0.0 <= min_on_time <= 1.0:
        raise InvalidInput("field 'min_on_time' must be a probability from 0 to 1")
    return now, top_k, min_on_time


def parse_dispatch_request(document: object, default_now: int) -> DispatchRequest:
    """Parse the body; orders with bad fields become ``Rejected`` entries.

    Args:
        document: the decoded JSON body.
        default_now: Unix ms used when the body has no ``now`` (the server's clock).

    Raises:
        InvalidInput: naming the field, when the request as a whole is malformed (top-level
            fields, an order without a usable id, any courier); PayloadTooLarge beyond
            ``MAX_PAIRS`` pairs.
    """
    top = _object(document, "", _TOP)
    raw_orders, raw_couriers = _list(top, "orders", MAX_ORDERS), _list(top, "couriers", MAX_COURIERS)
    if len(raw_orders) * len(raw_couriers) > MAX_PAIRS:
        raise PayloadTooLarge(
            f"{len(raw_orders)} orders x {len(raw_couriers)} couriers exceeds {MAX_PAIRS} pairs per request"
        )
    constraints = parse_constraints(top.get("constraints"))
    seen_orders: set[str] = set()
    seen_couriers: set[str] = set()
    system = top.get("coord_system", "wgs84")
    if system not in COORD_SYSTEMS:
        raise InvalidInput(f"field 'coord_system' must be one of {list(COORD_SYSTEMS)}")
    frame = _Frame(system)
    couriers = tuple(_courier(c, f"couriers[{i}]", seen_couriers, frame) for i, c in enumerate(raw_couriers))
    near = (sum(c.lat for c in couriers) / len(couriers), sum(c.lon for c in couriers) / len(couriers))
    orders_frame = _Frame(frame.system, near)
    parsed = [_order(o, f"orders[{i}]", seen_orders, orders_frame) for i, o in enumerate(raw_orders)]
    orders = tuple(o for o in parsed if isinstance(o, Order))
    rejected = tuple(o for o in parsed if isinstance(o, Rejected))
    pareto = top.get("pareto", "mark")
    if pareto not in ("mark", "filter"):
        raise InvalidInput("field 'pareto' must be 'mark' or 'filter'")
    return DispatchRequest(
        orders,
        rejected,
        couriers,
        *_settings(top, default_now),
        pareto_filter=pareto == "filter",
        constraints=constraints,
    )
