"""Dispatch constraint tags: strict parsing, point-in-polygon, peak travel times, slack features."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ortserve.apps.dispatch.constraints import (
    MAX_CONSTRAINTS,
    MAX_VERTICES,
    Peak,
    Zone,
    inside_polygon,
    parse_constraints,
    travel_minutes,
    zone_effects,
)
from ortserve.apps.dispatch.features import FEATURE_NAMES, pair_features
from ortserve.apps.dispatch.request import parse_dispatch_request
from ortserve.errors import InvalidInput

NOON_CHINA = 1_759_032_000_000
"""2025-09-28 12:00 China time (04:00 UTC)."""
SLACK = FEATURE_NAMES.index("slack_h")
SQUARE = [[39.90, 116.40], [39.90, 116.42], [39.92, 116.42], [39.92, 116.40]]
LUNCH = {"kind": "peak", "start": "11:00", "end": "13:30", "speed_factor": 0.6}


def zone(**extra: object) -> dict[str, object]:
    return {"kind": "no_stopping", "polygon": SQUARE, **extra}


def test_a_peak_and_a_zone_are_parsed_with_their_defaults() -> None:
    parsed = parse_constraints([LUNCH, zone(name="cbd", walk_minutes=5)])
    assert parsed.peaks == (Peak("constraints[0]", 660, 810, 0.6),)
    [cbd] = parsed.zones
    assert (cbd.name, cbd.walk_minutes, cbd.forbidden) == ("cbd", 5.0, False)
    assert cbd.lats == (39.90, 39.90, 39.92, 39.92)
    assert parse_constraints(None).peaks == () and parse_constraints([]).zones == ()


@pytest.mark.parametrize(
    ("constraints", "field"),
    [
        ({"kind": "peak"}, "constraints"),
        ([{"kind": "toll"}], "constraints[0].kind"),
        ([LUNCH | {"speed_factor": 0.01}], "constraints[0].speed_factor"),
        ([LUNCH | {"speed_factor": True}], "constraints[0].speed_factor"),
        ([LUNCH | {"start": "25:00"}], "constraints[0].start"),
        ([LUNCH | {"end": "1pm"}], "constraints[0].end"),
        ([LUNCH | {"end": "11:00"}], "constraints[0].end"),
        ([LUNCH | {"priority": 1}], "constraints[0].priority"),
        ([LUNCH, zone(polygon=SQUARE[:2])], "constraints[1].polygon"),
        ([zone(polygon=SQUARE * 17)], "constraints[0].polygon"),
        ([zone(polygon=[[39.9, 116.4], [39.9, 1e309], [40.0, 116.5]])], "constraints[0].polygon[1]"),
        ([zone(polygon=[[39.9, 116.4], [95.0, 116.4], [40.0, 116.5]])], "constraints[0].polygon[1]"),
        ([zone(polygon=[[39.9, 116.4], [39.9], [40.0, 116.5]])], "constraints[0].polygon[1]"),
        ([zone(walk_minutes=500)], "constraints[0].walk_minutes"),
        ([zone(forbidden="yes")], "constraints[0].forbidden"),
        ([zone(name="")], "constraints[0].name"),
        ([LUNCH] * (MAX_CONSTRAINTS + 1), "constraints"),
    ],
)
def test_a_bad_constraint_is_refused_naming_its_field(constraints: object, field: str) -> None:
    with pytest.raises(InvalidInput, match=f"field '{re.escape(field)}[.' ]"):
        parse_constraints(constraints)


def test_the_limits_themselves_are_accepted() -> None:
    ring = [[39.9 + 0.01 * np.sin(a), 116.4 + 0.01 * np.cos(a)] for a in np.linspace(0, 6.28, MAX_VERTICES)]
    parsed = parse_constraints([zone(polygon=ring)] + [LUNCH] * (MAX_CONSTRAINTS - 1))
    assert len(parsed.zones[0].lats) == MAX_VERTICES and len(parsed.peaks) == MAX_CONSTRAINTS - 1


def test_points_inside_a_concave_polygon_are_found_and_the_notch_is_outside() -> None:
    # A U shape: the notch between its arms (39.915, 116.41) is outside.
    u_shape = Zone(
        "u",
        (39.90, 39.90, 39.93, 39.93, 39.91, 39.91, 39.93, 39.93),
        (116.40, 116.43, 116.43, 116.42, 116.42, 116.41, 116.41, 116.40),
        0.0,
        False,
    )
    lat = np.array([39.905, 39.925, 39.925, 39.915, 39.95, 39.905])
    lon = np.array([116.415, 116.405, 116.425, 116.415, 116.415, 116.50])
    assert inside_polygon(lat, lon, u_shape).tolist() == [True, True, True, False, False, False]


def test_an_order_pays_the_longest_walk_of_its_zones_and_a_forbidden_zone_names_itself() -> None:
    zones = parse_constraints(
        [
            zone(name="plaza", walk_minutes=3),
            zone(name="campus", walk_minutes=8, polygon=[[39.89, 116.39], [39.89, 116.43], [39.91, 116.41]]),
            zone(
                name="barracks", forbidden=True, polygon=[[39.95, 116.45], [39.95, 116.47], [39.97, 116.46]]
            ),
        ]
    ).zones
    effects = zone_effects(
        np.array([39.905, 39.915, 39.955, 40.2]), np.array([116.41, 116.41, 116.46, 116.4]), zones
    )
    assert effects.walk_minutes.tolist() == [8.0, 3.0, 0.0, 0.0]
    assert effects.names == (("plaza", "campus"), ("plaza",), ("barracks",), ())
    assert effects.blocked[:2] == (None, None) and effects.blocked[3] is None
    assert "'barracks'" in str(effects.blocked[2])


def test_travel_inside_a_peak_window_is_slower_by_its_factor() -> None:
    kmh, distance = 15.0, np.array([0.0, 5.0, 15.0])
    lunch = (Peak("lunch", 11 * 60, 13 * 60 + 30, 0.5),)
    # From 12:00, the first 90 minutes run at 7.5 km/h (11.25 km), then 15 km/h.
    assert travel_minutes(distance, kmh, lunch, NOON_CHINA).tolist() == pytest.approx([0.0, 40.0, 105.0])
    # From 10:00 the window starts after an hour (15 km at full speed): nothing slows.
    assert travel_minutes(distance, kmh, lunch, NOON_CHINA - 2 * 3_600_000).tolist() == pytest.approx(
        [0.0, 20.0, 60.0]
    )
    assert travel_minutes(distance, kmh, (), NOON_CHINA).tolist() == pytest.approx([0.0, 20.0, 60.0])


def test_a_window_across_midnight_and_overlapping_peaks_take_the_slowest_speed() -> None:
    night = Peak("night", 23 * 60, 1 * 60, 0.5)
    midnight_china = NOON_CHINA + 12 * 3_600_000
    assert travel_minutes(np.array([7.5]), 15.0, (night,), midnight_china).tolist() == pytest.approx([60.0])
    both = (Peak("a", 11 * 60, 14 * 60, 0.8), Peak("b", 12 * 60, 13 * 60, 0.25))
    # 12:00-13:00 at 3.75 km/h covers 3.75 km; the rest at 12 km/h.
    assert travel_minutes(np.array([6.15]), 15.0, both, NOON_CHINA).tolist() == pytest.approx([72.0])


def _slack(constraints: list[object], now: int = NOON_CHINA) -> float:
    document = {
        "now": now,
        "orders": [{"id": "o1", "lat": 39.91, "lon": 116.41, "created_at": now, "deadline": now + 3_600_000}],
        "couriers": [{"id": "c1", "lat": 39.95, "lon": 116.41, "capacity": 5}],
        "constraints": constraints,
    }
    return float(pair_features(parse_dispatch_request(document, now)).rows[0, SLACK])


def test_the_slack_feature_counts_a_peak_and_a_zones_walk() -> None:
    plain = _slack([])
    assert _slack([LUNCH]) < plain - 0.1
    assert _slack([LUNCH], now=NOON_CHINA + 4 * 3_600_000) == pytest.approx(plain)
    assert _slack([zone(walk_minutes=6)]) == pytest.approx(plain - 0.1)


def test_a_request_refuses_bad_constraints_with_a_400_naming_the_field() -> None:
    with pytest.raises(InvalidInput, match=r"constraints\[0\]\.polygon"):
        _slack([zone(polygon="inside")])
