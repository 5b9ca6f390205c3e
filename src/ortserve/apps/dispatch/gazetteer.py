"""Placing Chinese addresses: a gazetteer shipped as package data (``data/gazetteer.json``) and
a rule-based parser over it.

Names match in full or in short form (without 省/市/区/县/自治区/新区..., so 浦东 is 浦东新区 and
深圳南山 is 深圳市南山区), plus listed aliases. A short form directly followed by another unit
suffix is not a match (朝阳区 never reads as 朝阳市). A district named without its city that
exists in several cities (朝阳区: Beijing and Changchun) is placed in the one nearest the
request's couriers when they are known, else the address is ambiguous.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from importlib import resources

from ortserve.errors import InvalidInput

__all__ = ["Place", "place_address"]

_SUFFIXES = (
    "特别行政区",
    "维吾尔自治区",
    "壮族自治区",
    "回族自治区",
    "自治区",
    "白族自治州",
    "自治州",
    "新区",
    "地区",
    "省",
    "盟",
    "市",
    "区",
    "县",
)
_UNIT_CHARS = "省市区县州"


@dataclass(frozen=True, slots=True)
class Place:
    """Where an address was placed: the most precise level found and its centroid (WGS84)."""

    province: str
    city: str
    district: str | None
    lat: float
    lon: float
    road: str | None = None
    """The road named after the city or district (中关村大街), if any."""
    number: str | None = None
    """The house number on that road (``1`` in 中关村大街1号), if any."""
    precision: str = "city"
    """What the position is the centre of: ``road`` (a road the gazetteer knows), ``area`` (a
    sub-district area: 望京, 张江), ``district`` or ``city``."""

    @property
    def uncertainty_km(self) -> float:
        """How far the real address may lie from the position, by precision (a road's point
        is on the road but not at the number; an area's centre is within its blocks; a
        district's or city's centre can be tens of kilometres off in the large ones)."""
        return UNCERTAINTY_KM[self.precision]


@dataclass(frozen=True, slots=True)
class _City:
    province: str
    name: str
    forms: tuple[str, ...]
    at: tuple[float, float]
    districts: dict[str, tuple[float, float]]
    roads: dict[str, tuple[float, float]]
    areas: dict[str, tuple[float, float, str]]


@dataclass(frozen=True, slots=True)
class _Gazetteer:
    provinces: dict[str, tuple[str, ...]]
    cities: tuple[_City, ...]


def _forms(name: str, aliases: list[str], short: bool = True) -> tuple[str, ...]:
    forms = [name, *aliases]
    if name.endswith("自治州"):  # 延边 is also written 延边州
        forms += [alias + "州" for alias in aliases if not alias.endswith(("州", "市"))]
    for suffix in _SUFFIXES if short else ():
        if name.endswith(suffix) and len(name) - len(suffix) >= 2:
            forms.append(name[: -len(suffix)])
            break
    return tuple(dict.fromkeys(forms))


@functools.cache
def _gazetteer() -> _Gazetteer:
    raw = json.loads(
        (resources.files("ortserve.apps.dispatch") / "data" / "gazetteer.json").read_text("utf-8")
    )
    provinces: dict[str, tuple[str, ...]] = {}
    cities: list[_City] = []
    for province in raw["provinces"]:
        provinces[province["name"]] = _forms(province["name"], province.get("aliases", []))
        for city in province["cities"]:
            districts = {name: (at[0], at[1]) for name, at in city.get("districts", {}).items()}
            cities.append(
                _City(
                    province["name"],
                    city["name"],
                    _forms(city["name"], city.get("aliases", []), city.get("short", True)),
                    (city["at"][0], city["at"][1]),
                    districts,
                    {name: (at[0], at[1]) for name, at in city.get("roads", {}).items()},
                    {name: (at[0], at[1], at[2]) for name, at in city.get("areas", {}).items()},
                )
            )
    return _Gazetteer(provinces, tuple(cities))


def _position(text: str, forms: tuple[str, ...]) -> int | None:
    """Earliest position where one of the forms is mentioned (a short form not followed by
    another unit's suffix)."""
    best: int | None = None
    for i, form in enumerate(forms):
        start = text.find(form)
        while start != -1:
            after = text[start + len(form) : start + len(form) + 1]
            if i == 0 or after not in _UNIT_CHARS or not after:
                best = start if best is None else min(best, start)
                break
            start = text.find(form, start + 1)
    return best


UNCERTAINTY_KM = {"road": 1.0, "area": 1.5, "district": 5.0, "city": 15.0}
"""How far an address may lie from its placed position, by the placement's precision."""
_NEAR_DEGREES = 0.45
"""About 50 km (the dispatch service radius) in degrees of latitude."""


def _distance(a: tuple[float, float], b: tuple[float, float]) -> float:
    dlat, dlon = a[0] - b[0], (a[1] - b[1]) * math.cos(math.radians((a[0] + b[0]) / 2))
    return math.hypot(dlat, dlon)


def _district_hits(text: str, cities: list[_City]) -> list[tuple[int, _City, str]]:
    hits = []
    for city in cities:
        for district in city.districts:
            at = _position(text, _forms(district, []))
            if at is not None:
                hits.append((at, city, district))
    return sorted(hits, key=lambda hit: hit[0])


def _first_named(text: str, cities: list[_City]) -> _City | None:
    """The city mentioned first in ``text``, if any."""
    named = sorted((at, i) for i, c in enumerate(cities) if (at := _position(text, c.forms)) is not None)
    return cities[named[0][1]] if named else None


def place_address(address: str, field: str, near: tuple[float, float] | None = None) -> Place:
    """Province, city, district, road and house number of ``address``, placed at the finest
    level the gazetteer knows (a listed road, else the district or city centre).

    Args:
        address: free text, e.g. ``北京市朝阳区建国路88号`` or ``浦东张江``.
        field: named in errors.
        near: a point (lat, lon) that decides between same-named districts of several cities.

    Raises:
        InvalidInput: naming ``field`` when the address names no known city or district, only a
            province, a district not in the city it names, or an ambiguous district.
    """
    text = "".join(address.split())
    gazetteer = _gazetteer()
    mentioned = [
        (at, name)
        for name, forms in gazetteer.provinces.items()
        if (at := _position(text, forms)) is not None
    ]
    province = min(mentioned)[1] if mentioned else None
    candidates = [c for c in gazetteer.cities if province is None or c.province == province]
    city = _first_named(text, candidates)
    if city is None and province is not None and not _district_hits(text, candidates):
        # The province's name may be part of a city's (海南 in 海南藏族自治州, Qinghai).
        inside = _first_named(text, list(gazetteer.cities))
        if inside is not None and any(p in f for p in gazetteer.provinces[province] for f in inside.forms):
            city, candidates = inside, [inside]
    hits = _district_hits(text, [city] if city is not None else candidates)
    if city is not None and not hits:
        elsewhere = _district_hits(text, [c for c in gazetteer.cities if c is not city])
        # Only a city whose districts are listed can say a district is not its own (鼓楼区 is
        # in Nanjing's list and also in Fuzhou, whose districts are not listed).
        if city.districts and elsewhere and not any(d in city.districts for _, _, d in elsewhere):
            raise InvalidInput(
                f"field {field!r}: district {elsewhere[0][2]} is not in {city.name} ({address!r})"
            )
        return _refined(text, city, None)
    if not hits:
        level = f"only the province {province}" if province else "no known city or district"
        raise InvalidInput(f"field {field!r}: cannot place address {address!r}: it names {level}")
    first = [hit for hit in hits if hit[0] == hits[0][0]]
    if len(first) > 1:
        if near is not None:
            first.sort(key=lambda hit: _distance(hit[1].districts[hit[2]], near))
        # Same-named districts (朝阳区 in Beijing and Changchun): the one near the couriers is
        # meant; with none near them, guessing would route to another city.
        if near is None or _distance(first[0][1].districts[first[0][2]], near) > _NEAR_DEGREES:
            where = ", ".join(c.name for _, c, _ in first)
            raise InvalidInput(
                f"field {field!r}: {first[0][2]} in {address!r} is ambiguous ({where}); name the city"
            )
    _, found, district = first[0]
    return _refined(text, found, district)


_ROAD = re.compile(r"([^省市区县州盟旗镇乡村号\d\s]{1,12}?(?:大道|大街|胡同|路|街|巷|弄))(?:(\d+)号)?")


def _refined(text: str, city: _City, district: str | None) -> Place:
    """The place at the finest level known: a road of the city in the gazetteer's table, else
    the district's or the city's centre; the road and house number are parsed either way."""
    road, number = None, None
    match = _ROAD.search(text)
    if match is not None:
        road, number = match.group(1), match.group(2)
        for form in sorted((*city.forms, *_forms(district or city.name, [])), key=len, reverse=True):
            if road.startswith(form) and len(road) > len(form):  # 浦东世纪大道: the road is 世纪大道
                road = road[len(form) :]
                break
    known = [name for name in city.roads if name in text]
    area = max((name for name in city.areas if name in text), key=len, default=None)
    if area is not None and not known:
        lat, lon, in_district = city.areas[area]
        if district is None or district == in_district:
            return Place(city.province, city.name, in_district, lat, lon, road, number, "area")
    if known:
        name = max(known, key=len)
        after = re.match(r"(\d+)号", text[text.index(name) + len(name) :])
        number = after.group(1) if after else None
        return Place(city.province, city.name, district, *city.roads[name], name, number, "road")
    if district is not None:
        return Place(city.province, city.name, district, *city.districts[district], road, number, "district")
    return Place(city.province, city.name, None, *city.at, road, number, "city")
