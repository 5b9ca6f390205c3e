"""The hotword request is validated strictly, every error naming its field; the calendar."""

from __future__ import annotations

import datetime as dt

import pytest

from ortserve.apps.hotword.holidays import calendar_features, china_time, holiday_closeness
from ortserve.apps.hotword.request import (
    DEFAULT_TOP_K,
    MAX_QUERY_CHARS,
    MAX_TOP_K,
    HotwordRequest,
    parse_hotword_request,
)
from ortserve.errors import InvalidInput

NOW = 1_759_017_600_000  # 2025-09-28 08:00 CST


def test_a_valid_request_parses_and_region_defaults_to_national() -> None:
    assert parse_hotword_request({"query": " 国庆旅游 ", "timestamp": NOW}) == HotwordRequest(
        "国庆旅游", 0, NOW
    )
    assert parse_hotword_request({"query": "x", "region_id": 110105, "timestamp": NOW}).region_id == 110105
    assert parse_hotword_request({"query": "x", "timestamp": NOW}).top_k == DEFAULT_TOP_K == 5
    assert parse_hotword_request({"query": "x", "timestamp": NOW, "top_k": 20}).top_k == 20


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"query": "a", "timestamp": NOW, "city": "北京"}, "'city'"),
        ({"timestamp": NOW}, "'query'"),
        ({"query": 42, "timestamp": NOW}, "'query'"),
        ({"query": "   ", "timestamp": NOW}, "'query'"),
        ({"query": "长" * (MAX_QUERY_CHARS + 1), "timestamp": NOW}, "'query'"),
        ({"query": "a", "region_id": "110000", "timestamp": NOW}, "'region_id'"),
        ({"query": "a", "region_id": True, "timestamp": NOW}, "'region_id'"),
        ({"query": "a", "region_id": 990000, "timestamp": NOW}, "'region_id'"),
        ({"query": "a", "region_id": 11, "timestamp": NOW}, "'region_id'"),
        ({"query": "a"}, "'timestamp'"),
        ({"query": "a", "timestamp": 1.5e12}, "'timestamp'"),
        ({"query": "a", "timestamp": 1_700_000_000}, "'timestamp'"),
        ({"query": "a", "timestamp": NOW, "top_k": 0}, "'top_k'"),
        ({"query": "a", "timestamp": NOW, "top_k": MAX_TOP_K + 1}, "'top_k'"),
        ({"query": "a", "timestamp": NOW, "top_k": 2.0}, "'top_k'"),
    ],
)
def test_a_bad_field_is_rejected_naming_it(document: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput, match=field):
        parse_hotword_request(document)


def test_a_body_that_is_not_an_object_is_rejected() -> None:
    with pytest.raises(InvalidInput, match="JSON object"):
        parse_hotword_request(["query"])


def test_timestamps_are_read_in_china_time() -> None:
    utc_evening = int(dt.datetime(2025, 9, 30, 17, tzinfo=dt.UTC).timestamp() * 1000)
    assert china_time(utc_evening).date() == dt.date(2025, 10, 1)
    assert calendar_features(utc_evening).hour == 1


def test_holiday_closeness_builds_before_the_holiday_and_is_zero_out_of_season() -> None:
    national = [holiday_closeness("national_day", dt.date(2025, 9, d)) for d in (10, 20, 28)]
    assert national == sorted(national) and national[0] > 0
    assert holiday_closeness("national_day", dt.date(2025, 10, 2)) == 1.0
    assert holiday_closeness("national_day", dt.date(2025, 3, 12)) == 0.0
    assert holiday_closeness("spring", dt.date(2026, 2, 17)) == 1.0
    assert calendar_features(NOW).days_to_nearest == 3


def test_routings_body_fields_are_accepted_without_a_routing_policy_and_still_checked() -> None:
    parsed = parse_hotword_request({"query": "x", "timestamp": NOW, "user_id": "u-17", "ab_tag": 2})
    assert parsed == HotwordRequest("x", 0, NOW)
    with pytest.raises(InvalidInput, match="'user_id'"):
        parse_hotword_request({"query": "x", "timestamp": NOW, "user_id": ["u"]})
    with pytest.raises(InvalidInput, match="'ab_tag' is longer"):
        parse_hotword_request({"query": "x", "timestamp": NOW, "ab_tag": "t" * 129})


def test_chunyun_is_a_forty_day_season_and_holidays_peak_before_their_day() -> None:
    assert holiday_closeness("chunyun", dt.date(2026, 2, 2)) == 1.0  # 15 days before 春节 (02-17)
    assert holiday_closeness("chunyun", dt.date(2026, 3, 13)) == 1.0  # its 40th day
    assert holiday_closeness("chunyun", dt.date(2026, 3, 14)) == 0.0
    assert 0.2 < holiday_closeness("chunyun", dt.date(2026, 1, 25)) < 1.0  # tickets, the week before
    assert holiday_closeness("national_day", dt.date(2026, 9, 24)) == 1.0  # booked the week before
    assert holiday_closeness("dragon_boat", dt.date(2026, 6, 8)) > 0.2  # 11 days before
