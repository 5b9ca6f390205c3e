"""A small built-in gazetteer and the rule-based address parser that places Chinese addresses."""

from __future__ import annotations

from dataclasses import dataclass

from ortserve.errors import InvalidInput

__all__ = ["Place", "place_address"]


@dataclass(frozen=True, slots=True)
class Place:
    """Where an address was placed: the most precise level found and its centroid."""

    province: str
    city: str
    district: str | None
    lat: float
    lon: float


@dataclass(frozen=True, slots=True)
class _City:
    province: str
    name: str
    centroid: tuple[float, float]
    districts: dict[str, tuple[float, float]]


_CITIES = (
    _City("北京市", "北京市", (39.9042, 116.4074), {
        "朝阳区": (39.9219, 116.4436), "海淀区": (39.9593, 116.2981), "东城区": (39.9288, 116.4163),
        "西城区": (39.9123, 116.3660), "丰台区": (39.8585, 116.2867),
    }),
    _City("上海市", "上海市", (31.2304, 121.4737), {
        "浦东新区": (31.2214, 121.5447), "黄浦区": (31.2317, 121.4846), "徐汇区": (31.1885, 121.4365),
        "静安区": (31.2290, 121.4480),
    }),
    _City("广东省", "广州市", (23.1291, 113.2644), {
        "天河区": (23.1247, 113.3612), "越秀区": (23.1290, 113.2668), "海珠区": (23.0838, 113.3172),
    }),
    _City("广东省", "深圳市", (22.5431, 114.0579), {
        "南山区": (22.5333, 113.9304), "福田区": (22.5410, 114.0550), "罗湖区": (22.5482, 114.1315),
    }),
    _City("浙江省", "杭州市", (30.2741, 120.1551), {
        "西湖区": (30.2596, 120.1300), "上城区": (30.2425, 120.1692), "滨江区": (30.2084, 120.2118),
    }),
    _City("四川省", "成都市", (30.5728, 104.0668), {
        "武侯区": (30.6420, 104.0430), "锦江区": (30.6570, 104.0830), "青羊区": (30.6740, 104.0620),
    }),
)  # fmt: skip
_PROVINCES = {city.province for city in _CITIES}


def _short(name: str) -> str:
    return name[:-1] if name[-1] in "省市区" and len(name) > 2 else name


def _find(text: str, names: set[str] | list[str]) -> str | None:
    """The name (full, or short form without 省/市) found earliest in ``text``."""
    hits = [(text.find(form), name) for name in names for form in {name, _short(name)} if form in text]
    return min(hits)[1] if hits else None


def _city_of(text: str, province: str | None) -> _City | None:
    candidates = [c for c in _CITIES if province is None or c.province == province]
    name = _find(text, [c.name for c in candidates])
    if name is not None:
        return next(c for c in candidates if c.name == name)
    by_district = [c for c in candidates if _find(text, list(c.districts))]
    return by_district[0] if len(by_district) == 1 else None


def place_address(address: str, field: str) -> Place:
    """Province, city and district of ``address`` from the gazetteer, at the finest level named.

    Raises:
        InvalidInput: naming ``field`` when the address names no known city or district, only a
            province, or a district that is not in the city it names.
    """
    text = "".join(address.split())
    province = _find(text, _PROVINCES)
    city = _city_of(text, province)
    if city is None:
        level = f"only the province {province}" if province else "no known city or district"
        raise InvalidInput(f"field {field!r}: cannot place address {address!r}: it names {level}")
    district = _find(text, list(city.districts))
    if district is None:
        other = _find(text, [d for c in _CITIES for d in c.districts])
        if other is not None:
            raise InvalidInput(f"field {field!r}: district {other} is not in {city.name} ({address!r})")
        return Place(city.province, city.name, None, *city.centroid)
    return Place(city.province, city.name, district, *city.districts[district])
