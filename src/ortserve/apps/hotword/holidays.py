"""Chinese public holidays (2020-2030) and the calendar features derived from a timestamp."""

from __future__ import annotations

import bisect
import datetime as dt
import math
from dataclasses import dataclass

__all__ = ["HOLIDAYS", "CalendarFeatures", "calendar_features", "china_time", "holiday_closeness"]

CHINA = dt.timezone(dt.timedelta(hours=8), "CST")
_YEARS = range(2020, 2031)
# Lunar-calendar holidays differ every year; the fixed ones are generated below.
_LUNAR = {
    "spring": [
        "01-25",
        "02-12",
        "02-01",
        "01-22",
        "02-10",
        "01-29",
        "02-17",
        "02-06",
        "01-26",
        "02-13",
        "02-03",
    ],
    "qingming": [
        "04-04",
        "04-04",
        "04-05",
        "04-05",
        "04-04",
        "04-04",
        "04-05",
        "04-05",
        "04-04",
        "04-04",
        "04-05",
    ],
    "dragon_boat": [
        "06-25",
        "06-14",
        "06-03",
        "06-22",
        "06-10",
        "05-31",
        "06-19",
        "06-09",
        "05-28",
        "06-16",
        "06-05",
    ],
    "mid_autumn": [
        "10-01",
        "09-21",
        "09-10",
        "09-29",
        "09-17",
        "10-06",
        "09-25",
        "09-15",
        "10-03",
        "09-22",
        "09-12",
    ],
}
_FIXED = {"new_year": "01-01", "labour_day": "05-01", "national_day": "10-01"}
HOLIDAY_NAMES = (
    "new_year",
    "spring",
    "qingming",
    "labour_day",
    "dragon_boat",
    "mid_autumn",
    "national_day",
    "chunyun",
)
"""Season keys in feature order: 元旦, 春节, 清明, 劳动节, 端午, 中秋, 国庆, and 春运, the 40-day
travel season around 春节 (from 15 days before it), a season of its own rather than a day."""
_CHUNYUN_BEFORE_SPRING = 15


def _dates() -> dict[str, list[dt.date]]:
    table: dict[str, list[dt.date]] = {}
    for name in HOLIDAY_NAMES[:-1]:
        days = _LUNAR.get(name) or [_FIXED[name]] * len(_YEARS)
        table[name] = [dt.date.fromisoformat(f"{year}-{day}") for year, day in zip(_YEARS, days, strict=True)]
    table["chunyun"] = [day - dt.timedelta(days=_CHUNYUN_BEFORE_SPRING) for day in table["spring"]]
    return table


HOLIDAYS = _dates()
LEAD_DAYS = 21
"""Interest in a season builds over the three weeks before its peak."""
PEAK_DAYS = {"spring": 15, "national_day": 7, "labour_day": 7, "mid_autumn": 7, "dragon_boat": 7}
"""Days before a holiday that already are its peak: trips for 国庆, 五一 and the three-day
holidays are booked the week before, 春节's two weeks before (the first days of 春运). Others
peak on the day."""
STAY_DAYS = {"chunyun": 39}
"""Days a season lasts after it starts: 春运 40 days in all; a holiday 3 (its first days)."""
_STAY_DEFAULT = 3


def china_time(timestamp_ms: int) -> dt.datetime:
    """A Unix-millisecond timestamp as China Standard Time (UTC+8)."""
    return dt.datetime.fromtimestamp(timestamp_ms / 1000, tz=CHINA)


_ORDINALS = {name: [date.toordinal() for date in dates] for name, dates in HOLIDAYS.items()}
_ALL_ORDINALS = sorted(o for name, ordinals in _ORDINALS.items() if name != "chunyun" for o in ordinals)


def holiday_closeness(name: str, day: dt.date) -> float:
    """1.0 from the season's peak (``PEAK_DAYS`` before it) through its stay, decaying over
    ``LEAD_DAYS`` before the peak, else 0."""
    ordinals = _ORDINALS[name]
    today = day.toordinal()
    index = bisect.bisect_left(ordinals, today - STAY_DAYS.get(name, _STAY_DEFAULT))
    if index == len(ordinals):
        return 0.0
    until = ordinals[index] - today - PEAK_DAYS.get(name, 0)
    if until <= 0:
        return 1.0
    return math.exp(-until / 7) if until <= LEAD_DAYS else 0.0


@dataclass(frozen=True, slots=True)
class CalendarFeatures:
    """Hour and weekday in China time, closeness to each holiday, days to the nearest one."""

    hour: int
    weekday: int
    closeness: tuple[float, ...]
    days_to_nearest: int


def _days_to_nearest(day: dt.date) -> int:
    today = day.toordinal()
    index = bisect.bisect_left(_ALL_ORDINALS, today)
    near = _ALL_ORDINALS[max(index - 1, 0) : index + 1]
    return min(abs(o - today) for o in near)


def calendar_features(timestamp_ms: int) -> CalendarFeatures:
    """The calendar features of one moment."""
    moment = china_time(timestamp_ms)
    day = moment.date()
    closeness = tuple(holiday_closeness(name, day) for name in HOLIDAY_NAMES)
    return CalendarFeatures(moment.hour, moment.weekday(), closeness, _days_to_nearest(day))
