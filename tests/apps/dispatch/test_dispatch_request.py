"""Dispatch inputs: geometry, the gazetteer address parser, strict request validation, bounds."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ortserve.apps.dispatch.gazetteer import place_address
from ortserve.apps.dispatch.geo import geohash, haversine_km, neighbourhood, same_neighbourhood
from ortserve.apps.dispatch.request import (
    DEFAULT_MIN_ON_TIME,
    DEFAULT_TOP_K,
    MAX_PAIRS,
    parse_dispatch_request,
)
from ortserve.errors import InvalidInput, PayloadTooLarge

NOW = 1_759_017_600_000


def order(identifier: str = "o1", **extra: object) -> dict[str, object]:
    return {
        "id": identifier,
        "lat": 39.92,
        "lon": 116.44,
        "created_at": NOW,
        "deadline": NOW + 1_800_000,
        **extra,
    }


def courier(identifier: str = "c1", **extra: object) -> dict[str, object]:
    return {"id": identifier, "lat": 39.93, "lon": 116.45, "capacity": 5, **extra}


def test_haversine_gives_the_great_circle_distance() -> None:
    beijing_shanghai = haversine_km(
        np.array(39.9042), np.array(116.4074), np.array(31.2304), np.array(121.4737)
    )
    assert float(beijing_shanghai) == pytest.approx(1067.3, abs=1.0)
    assert float(haversine_km(np.array(10.0), np.array(20.0), np.array(10.0), np.array(20.0))) == 0.0


def test_geohash_matches_the_reference_encoding_and_has_nine_neighbours() -> None:
    assert geohash(57.64911, 10.40744, 11) == "u4pruydqqvj"
    cells = neighbourhood(39.92, 116.44)
    assert len(cells) == 9 and geohash(39.92, 116.44) in cells
    assert all(len(cell) == 7 for cell in cells)
    assert geohash(39.9213, 116.4413) in cells  # about 150 m away


@pytest.mark.parametrize(
    ("address", "city", "district"),
    [
        ("北京市朝阳区建国路88号", "北京市", "朝阳区"),
        ("广东省深圳市南山区科技园", "深圳市", "南山区"),
        ("深圳南山区", "深圳市", "南山区"),
        ("海淀区中关村大街1号", "北京市", "海淀区"),
        ("四川省成都市", "成都市", None),
    ],
)
def test_the_address_parser_places_province_city_and_district(
    address: str, city: str, district: str | None
) -> None:
    place = place_address(address, "orders[0].address")
    assert (place.city, place.district) == (city, district)
    assert 18 < place.lat < 54 and 73 < place.lon < 135


@pytest.mark.parametrize(
    ("address", "why"),
    [("火星基地1号", "no known city"), ("广东省", "only the province"), ("上海市朝阳区1号", "not in 上海市")],
)
def test_an_address_that_cannot_be_placed_is_a_400_naming_the_field(address: str, why: str) -> None:
    with pytest.raises(InvalidInput, match=rf"orders\[0\]\.address.*{why}"):
        place_address(address, "orders[0].address")


def test_a_valid_request_parses_with_defaults() -> None:
    by_address = {"id": "o2", "address": "北京市海淀区", "created_at": NOW, "deadline": NOW + 1, "weight": 2}
    request = parse_dispatch_request({"orders": [order(), by_address], "couriers": [courier()]}, NOW + 5)
    assert request.now == NOW + 5 and request.top_k == DEFAULT_TOP_K == 5
    assert request.min_on_time == DEFAULT_MIN_ON_TIME and not request.rejected
    assert request.orders[1].placed_by == "海淀区" and request.orders[1].weight == 2.0
    assert request.couriers[0].load == 0.0


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"orders": [order()], "couriers": [courier()], "extra": 1}, "'extra'"),
        ({"orders": [], "couriers": [courier()]}, "'orders'"),
        ({"orders": [order()]}, "'couriers'"),
        ({"orders": ["o1"], "couriers": [courier()]}, r"orders\[0\]"),
        ({"orders": [order()], "couriers": [courier(), courier()]}, r"couriers\[1\]\.id"),
        ({"orders": [order(id=7)], "couriers": [courier()]}, r"orders\[0\]\.id"),
        ({"orders": [order()], "couriers": [courier(capacity=True)]}, r"couriers\[0\]\.capacity"),
        ({"orders": [order()], "couriers": [courier(load=-1)]}, r"couriers\[0\]\.load"),
        ({"orders": [order()], "couriers": [courier()], "top_k": 0}, "'top_k'"),
        ({"orders": [order()], "couriers": [courier()], "top_k": 2.5}, "'top_k'"),
        ({"orders": [order()], "couriers": [courier()], "min_on_time": 1.5}, "'min_on_time'"),
        ({"orders": [order()], "couriers": [courier()], "now": "today"}, "'now'"),
    ],
)
def test_a_request_malformed_as_a_whole_is_rejected_naming_the_field(
    document: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidInput, match=field):
        parse_dispatch_request(document, NOW)


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (order("bad", lat="39.9"), r"orders\[1\]\.lat"),
        (order("bad", lat=95.0), r"orders\[1\]\.lat"),
        (order("bad", deadline=NOW - 1), r"orders\[1\]\.deadline"),
        (order("bad", weight=0), r"orders\[1\]\.weight"),
        (order("bad", created_at=1.5), r"orders\[1\]\.created_at"),
        ({"id": "bad", "created_at": NOW, "deadline": NOW + 1}, r"orders\[1\].*address"),
        ({"id": "bad", "address": "火星基地1号", "created_at": NOW, "deadline": NOW + 1}, "cannot place"),
        # The gazetteer scans the whole text per name: a million characters held the loop 1 s.
        (
            {
                "id": "bad",
                "address": "北京市朝阳区" + "x" * 1_000_000,
                "created_at": NOW,
                "deadline": NOW + 1,
            },
            r"orders\[1\]\.address' is longer than 512 characters",
        ),
    ],
)
def test_an_order_with_a_bad_field_is_rejected_alone_with_the_reason(
    bad: dict[str, object], field: str
) -> None:
    request = parse_dispatch_request({"orders": [order("good"), bad], "couriers": [courier()]}, NOW)
    assert [o.id for o in request.orders] == ["good"]
    [rejected] = request.rejected
    assert rejected.id == "bad"
    assert re.search(field, rejected.reason)


def test_more_pairs_than_the_limit_is_payload_too_large() -> None:
    orders = [order(f"o{i}") for i in range(MAX_PAIRS // 200 + 1)]
    couriers = [courier(f"c{i}") for i in range(200)]
    with pytest.raises(PayloadTooLarge, match="pairs"):
        parse_dispatch_request({"orders": orders, "couriers": couriers}, NOW)


def test_the_vectorised_neighbourhood_agrees_with_geohash_strings() -> None:
    rng = np.random.default_rng(8)
    lat = 39.9 + rng.uniform(0, 0.01, 60)
    lon = 116.4 + rng.uniform(0, 0.01, 60)
    flags = same_neighbourhood(lat[:, None], lon[:, None], lat[None, :], lon[None, :])
    expected = np.array(
        [[geohash(b, d) in neighbourhood(a, c) for b, d in zip(lat, lon)] for a, c in zip(lat, lon)]
    )
    assert np.array_equal(flags, expected) and 0 < flags.mean() < 1


def test_an_order_id_given_twice_rejects_only_the_second_order() -> None:
    request = parse_dispatch_request(
        {"orders": [order(), order(), order(id="o2")], "couriers": [courier()]}, NOW
    )
    assert [o.id for o in request.orders] == ["o1", "o2"]
    (duplicate,) = request.rejected
    assert duplicate.id == "o1" and "orders[1].id" in duplicate.reason and "twice" in duplicate.reason


def test_an_unknown_order_field_is_ignored_and_named_not_a_rejection() -> None:
    request = parse_dispatch_request({"orders": [order(priority=3, tip="x")], "couriers": [courier()]}, NOW)
    (only,) = request.orders
    assert not request.rejected and only.ignored == ("priority", "tip")
    many = order() | {f"f{i:02}": i for i in range(40)}
    (capped,) = parse_dispatch_request({"orders": [many], "couriers": [courier()]}, NOW).orders
    assert len(capped.ignored) == 8


def test_an_orders_value_is_rounded_to_a_hundredth_and_bounded() -> None:
    request = parse_dispatch_request(
        {"orders": [order(value=2.345), order("o2")], "couriers": [courier()]}, NOW
    )
    assert [o.value for o in request.orders] == [2.35, 1.0]
    bad = parse_dispatch_request(
        {"orders": [order(value=0), order("o2", value=1e9)], "couriers": [courier()]}, NOW
    )
    assert [r.id for r in bad.rejected] == ["o1", "o2"] and all("value" in r.reason for r in bad.rejected)


def test_pareto_is_mark_or_filter() -> None:
    document = {"orders": [order()], "couriers": [courier()]}
    assert not parse_dispatch_request(document, NOW).pareto_filter
    assert parse_dispatch_request(document | {"pareto": "filter"}, NOW).pareto_filter
    with pytest.raises(InvalidInput, match="'pareto'"):
        parse_dispatch_request(document | {"pareto": "yes"}, NOW)
