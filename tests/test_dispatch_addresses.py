"""Addresses and coordinates: Chinese map systems converted against published reference points,
the gazetteer's coverage and aliases, same-named districts told apart by the couriers."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from ortserve.apps.dispatch.coords import (
    bd09_to_gcj02,
    gcj02_to_bd09,
    gcj02_to_wgs84,
    to_wgs84,
    wgs84_to_gcj02,
)
from ortserve.apps.dispatch.gazetteer import place_address
from ortserve.apps.dispatch.request import parse_dispatch_request
from ortserve.errors import InvalidInput

NOW = 1_759_017_600_000
# wandergis/coordtransform's published results for the point (lon 116.404, lat 39.915).
LAT, LON = 39.915, 116.404


def test_forward_conversions_match_the_published_reference_points() -> None:
    assert wgs84_to_gcj02(LAT, LON) == pytest.approx((39.91640428150164, 116.41024449916938), abs=1e-12)
    assert gcj02_to_bd09(LAT, LON) == pytest.approx((39.92133699351021, 116.41036949371029), abs=1e-12)
    assert bd09_to_gcj02(LAT, LON) == pytest.approx((39.90865673957631, 116.39762729119315), abs=1e-12)


def test_the_gcj02_inverse_round_trips_and_agrees_with_the_published_one_step_estimate() -> None:
    wgs = gcj02_to_wgs84(LAT, LON)
    assert wgs84_to_gcj02(*wgs) == pytest.approx((LAT, LON), abs=1e-8)
    # The published inverse is a single step (about a metre off); the iteration refines it.
    assert wgs == pytest.approx((39.91359571849836, 116.39775550083061), abs=2e-5)
    bd = gcj02_to_bd09(*wgs84_to_gcj02(LAT, LON))
    assert to_wgs84(*bd, "bd09") == pytest.approx((LAT, LON), abs=5e-6)  # BD-09 inverse: ~0.1 m


def test_positions_outside_china_are_not_offset() -> None:
    assert wgs84_to_gcj02(48.8566, 2.3522) == (48.8566, 2.3522)
    assert to_wgs84(48.8566, 2.3522, "gcj02") == (48.8566, 2.3522)


def test_every_province_level_division_and_its_cities_are_placed() -> None:
    data = json.loads(
        (resources.files("ortserve.apps.dispatch") / "data" / "gazetteer.json").read_text("utf-8")
    )
    assert len(data["provinces"]) == 34
    for province in data["provinces"]:
        for city in province["cities"]:
            place = place_address(province["name"] + city["name"] + "人民路1号", "a")
            assert (place.province, place.city) == (province["name"], city["name"])
            for district in city.get("districts", {}):
                assert place_address(city["name"] + district, "a").district == district


@pytest.mark.parametrize(
    ("address", "city", "district"),
    [
        ("浦东张江高科技园区", "上海市", "浦东新区"),
        ("上海浦东新区世纪大道100号", "上海市", "浦东新区"),
        ("深圳南山科技园", "深圳市", "南山区"),
        ("内蒙古包头", "包头市", None),
        ("长春市朝阳区人民大街", "长春市", "朝阳区"),
        ("辽宁省朝阳市", "朝阳市", None),
        ("广州天河体育中心", "广州市", "天河区"),
    ],
)
def test_short_forms_and_aliases_are_recognised(address: str, city: str, district: str | None) -> None:
    place = place_address(address, "a")
    assert (place.city, place.district) == (city, district)


def test_a_district_several_cities_have_is_placed_near_the_couriers_or_called_ambiguous() -> None:
    assert place_address("朝阳区建国路88号", "a", near=(39.9, 116.4)).city == "北京市"
    assert place_address("朝阳区建国路88号", "a", near=(43.8, 125.3)).city == "长春市"
    with pytest.raises(InvalidInput, match="ambiguous"):
        place_address("朝阳区建国路88号", "a")
    document = {
        "now": NOW,
        "orders": [{"id": "o1", "address": "朝阳区建国路88号", "created_at": NOW, "deadline": NOW + 1}],
        "couriers": [{"id": "c1", "lat": 43.82, "lon": 125.32, "capacity": 1}],
    }
    assert parse_dispatch_request(document, NOW).orders[0].lat == pytest.approx(43.834)


def test_coord_system_converts_request_positions_to_wgs84() -> None:
    gcj = wgs84_to_gcj02(LAT, LON)
    bd = gcj02_to_bd09(*gcj)
    for system, (lat, lon) in (("wgs84", (LAT, LON)), ("gcj02", gcj), ("bd09", bd)):
        document = {
            "coord_system": system,
            "orders": [{"id": "o1", "lat": lat, "lon": lon, "created_at": NOW, "deadline": NOW + 1}],
            "couriers": [{"id": "c1", "lat": lat, "lon": lon, "capacity": 1}],
        }
        request = parse_dispatch_request(document, NOW)
        assert (request.orders[0].lat, request.orders[0].lon) == pytest.approx((LAT, LON), abs=5e-6)
        assert (request.couriers[0].lat, request.couriers[0].lon) == pytest.approx((LAT, LON), abs=5e-6)
    with pytest.raises(InvalidInput, match="coord_system"):
        parse_dispatch_request({**document, "coord_system": "mars"}, NOW)
