"""Addresses and coordinates: Chinese map systems converted against published reference points,
the gazetteer's coverage and aliases, same-named districts told apart by the couriers."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import numpy as np
import pytest

from ortserve.apps.dispatch.coords import (
    bd09_to_gcj02,
    gcj02_to_bd09,
    gcj02_to_wgs84,
    to_wgs84,
    wgs84_to_gcj02,
)
from ortserve.apps.dispatch.gazetteer import UNCERTAINTY_KM, place_address
from ortserve.apps.dispatch.geo import haversine_km
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


# Rough bounding boxes (lat min, lat max, lon min, lon max) of each province-level division,
# written independently of the gazetteer so a swapped or mistyped coordinate shows.
PROVINCE_BOXES = {
    "北京市": (39.4, 41.1, 115.4, 117.5),
    "天津市": (38.5, 40.3, 116.7, 118.1),
    "河北省": (36.0, 42.7, 113.4, 119.9),
    "山西省": (34.5, 40.8, 110.2, 114.6),
    "内蒙古自治区": (37.4, 53.4, 97.1, 126.1),
    "辽宁省": (38.7, 43.5, 118.8, 125.8),
    "吉林省": (40.8, 46.3, 121.6, 131.4),
    "黑龙江省": (43.4, 53.6, 121.1, 135.1),
    "上海市": (30.6, 31.9, 120.8, 122.0),
    "江苏省": (30.7, 35.2, 116.3, 121.9),
    "浙江省": (27.0, 31.2, 118.0, 123.2),
    "安徽省": (29.4, 34.7, 114.9, 119.7),
    "福建省": (23.5, 28.4, 115.8, 120.8),
    "江西省": (24.4, 30.1, 113.5, 118.5),
    "山东省": (34.3, 38.4, 114.8, 122.8),
    "河南省": (31.3, 36.4, 110.3, 116.7),
    "湖北省": (29.0, 33.3, 108.3, 116.2),
    "湖南省": (24.6, 30.2, 108.7, 114.3),
    "广东省": (20.2, 25.6, 109.6, 117.4),
    "广西壮族自治区": (20.9, 26.4, 104.4, 112.1),
    "海南省": (3.5, 20.2, 108.6, 117.9),
    "重庆市": (28.1, 32.3, 105.2, 110.2),
    "四川省": (26.0, 34.4, 97.3, 108.6),
    "贵州省": (24.6, 29.3, 103.6, 109.6),
    "云南省": (21.1, 29.3, 97.5, 106.2),
    "西藏自治区": (26.8, 36.5, 78.3, 99.2),
    "陕西省": (31.7, 39.6, 105.4, 111.3),
    "甘肃省": (32.5, 42.8, 92.3, 108.8),
    "青海省": (31.6, 39.3, 89.4, 103.1),
    "宁夏回族自治区": (35.2, 39.4, 104.2, 107.7),
    "新疆维吾尔自治区": (34.3, 49.2, 73.4, 96.4),
    "台湾省": (21.8, 25.4, 119.9, 122.1),
    "香港特别行政区": (22.1, 22.6, 113.8, 114.5),
    "澳门特别行政区": (22.1, 22.3, 113.5, 113.7),
}
MUNICIPALITIES_AND_OUTSIDE_MAINLAND = {
    "北京市",
    "天津市",
    "上海市",
    "重庆市",
    "台湾省",
    "香港特别行政区",
    "澳门特别行政区",
}


def _gazetteer_data() -> Any:
    text = (resources.files("ortserve.apps.dispatch") / "data" / "gazetteer.json").read_text("utf-8")
    return json.loads(text)


def test_every_prefecture_level_division_lies_in_its_province_and_has_a_unique_name() -> None:
    provinces = _gazetteer_data()["provinces"]
    assert {str(p["name"]) for p in provinces} == set(PROVINCE_BOXES)
    names: list[str] = []
    prefecture_level = 0
    for province in provinces:
        lat_min, lat_max, lon_min, lon_max = PROVINCE_BOXES[province["name"]]
        for city in province["cities"]:
            lat, lon = city["at"]
            assert lat_min <= lat <= lat_max and lon_min <= lon <= lon_max, (province["name"], city)
            names += [city["name"], *city.get("aliases", [])]
            for district, (dlat, dlon) in city.get("districts", {}).items():
                assert abs(dlat - lat) < 1.0 and abs(dlon - lon) < 1.2, (city["name"], district)
        if province["name"] not in MUNICIPALITIES_AND_OUTSIDE_MAINLAND:
            prefecture_level += len(province["cities"])
    assert prefecture_level == 333  # 293 cities, 7 prefectures, 30 autonomous prefectures, 3 leagues
    assert len(names) == len(set(names))
    for name in names:  # every full name and alias alone places its own division
        assert name in place_address(name, "a").city or name in _aliases(
            provinces, place_address(name, "a").city
        )


def _aliases(provinces: Any, city: str) -> list[str]:
    return [
        alias
        for province in provinces
        for c in province["cities"]
        if c["name"] == city
        for alias in c.get("aliases", [])
    ]


@pytest.mark.parametrize(
    ("address", "city", "district"),
    [
        ("内蒙古锡林郭勒盟锡林浩特市", "锡林郭勒盟", None),
        ("锡林郭勒", "锡林郭勒盟", None),
        ("新疆喀什市人民东路", "喀什地区", None),
        ("延边州延吉市", "延边朝鲜族自治州", None),
        ("大兴安岭加格达奇", "大兴安岭地区", None),
        ("安徽马鞍山", "马鞍山市", None),
        ("鞍山市铁东区", "鞍山市", None),
        ("青海省海南藏族自治州共和县", "海南藏族自治州", None),
        ("海南藏族自治州共和县", "海南藏族自治州", None),
        ("海南州共和县", "海南藏族自治州", None),
        ("海南省三亚市", "三亚市", None),
        ("吉林省吉林市船营区", "吉林市", None),
        ("福州市鼓楼区五四路", "福州市", None),
        ("南京市鼓楼区中山路", "南京市", "鼓楼区"),
        ("成都市武侯区玉林路", "成都市", "武侯区"),
        ("黔南州都匀市", "黔南布依族苗族自治州", None),
        ("贵州黔西南兴义市", "黔西南布依族苗族自治州", None),
    ],
)
def test_prefecture_level_short_forms_and_aliases(address: str, city: str, district: str | None) -> None:
    place = place_address(address, "a")
    assert (place.city, place.district) == (city, district)


def test_a_short_form_marked_ambiguous_is_not_matched() -> None:
    assert place_address("西藏阿里地区狮泉河镇", "a").city == "阿里地区"
    with pytest.raises(InvalidInput, match="no known city"):
        place_address("阿里巴巴西溪园区", "a")


@pytest.mark.parametrize(
    ("address", "road", "number", "precision", "at"),
    [
        ("北京市海淀区中关村大街1号", "中关村大街", "1", "road", (39.975, 116.316)),
        ("上海市浦东新区世纪大道100号", "世纪大道", "100", "road", (31.229, 121.527)),
        ("浦东世纪大道8号", "世纪大道", "8", "road", (31.229, 121.527)),
        ("广州市天河区体育西路103号", "体育西路", "103", "district", (23.125, 113.361)),
        ("福州市鼓楼区五四路", "五四路", None, "city", (26.074, 119.296)),
        ("深圳南山科技园", None, None, "area", (22.540, 113.952)),  # the area, not 南山区's centre
        ("北京市朝阳区望京街58号", "望京街", "58", "area", (39.996, 116.475)),
        ("北京市朝阳区建国路88号", "建国路", "88", "road", (39.908, 116.468)),  # a known road wins
    ],
)
def test_road_and_house_number_are_parsed_and_a_known_road_refines_the_position(
    address: str, road: str | None, number: str | None, precision: str, at: tuple[float, float]
) -> None:
    place = place_address(address, "a")
    assert (place.road, place.number, place.precision) == (road, number, precision)
    assert (place.lat, place.lon) == at


def test_a_shared_district_name_far_from_every_courier_is_ambiguous_not_guessed() -> None:
    shanghai = (31.23, 121.47)
    with pytest.raises(InvalidInput, match=r"朝阳区 .* is ambiguous \(北京市, 长春市\); name the city"):
        place_address("朝阳区建国路88号", "orders[0].address", shanghai)
    assert place_address("北京市朝阳区建国路88号", "orders[0].address", shanghai).city == "北京市"


@pytest.mark.parametrize(
    ("address", "district", "at", "off_before_km"),
    [
        ("北京市朝阳区望京街58号", "朝阳区", (39.996, 116.475), 8.5),
        ("浦东张江高科", "浦东新区", (31.204, 121.590), 4.6),
        ("北京西城区金融街", "西城区", (39.916, 116.358), 0.7),
    ],
)
def test_a_known_area_is_placed_at_its_own_centre_with_its_uncertainty(
    address: str, district: str, at: tuple[float, float], off_before_km: float
) -> None:
    place = place_address(address, "a")
    assert (place.district, place.precision, (place.lat, place.lon)) == (district, "area", at)
    assert place.uncertainty_km == UNCERTAINTY_KM["area"] < UNCERTAINTY_KM["district"]
    centre = place_address(f"北京市{district}" if "北京" in address else f"上海市{district}", "a")
    moved = haversine_km(np.array(centre.lat), np.array(centre.lon), np.array(at[0]), np.array(at[1]))
    assert float(moved) == pytest.approx(off_before_km, abs=0.3)  # where the district centre put it
