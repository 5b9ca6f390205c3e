"""The synthetic search world: hotwords with their holidays, provinces and daily rhythm, and a
seeded query-log generator with that structure plus noise."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np

from ortserve.apps.hotword.holidays import CHINA, HOLIDAY_NAMES, holiday_closeness

__all__ = ["HOTWORDS", "PROVINCES", "Hotword", "LogRecord", "generate_log", "province_of"]

PROVINCES = (
    110000, 120000, 130000, 140000, 150000, 210000, 220000, 230000, 310000, 320000, 330000, 340000,
    350000, 360000, 370000, 410000, 420000, 430000, 440000, 450000, 460000, 500000, 510000, 520000,
    530000, 540000, 610000, 620000, 630000, 640000, 650000, 710000, 810000, 820000,
)  # fmt: skip
"""Province-level administrative codes; a city or district code maps to its province."""


def province_of(region_id: int) -> int | None:
    """The province code of an administrative code (0, national, has none)."""
    code = region_id // 10000 * 10000
    return code if code in PROVINCES else None


@dataclass(frozen=True, slots=True)
class Hotword:
    """A suggestion users click, and what makes it popular."""

    word: str
    terms: tuple[str, ...]
    holiday: str | None = None
    province: int | None = None
    peak_hour: int | None = None
    base: float = 1.0


def _hw(word: str, terms: str, **kwargs: object) -> Hotword:
    return Hotword(word, tuple(terms.split()), **kwargs)  # type: ignore[arg-type]


HOTWORDS = (
    _hw("国庆旅游攻略", "国庆 旅游 攻略 景点 出游", holiday="national_day"),
    _hw("国庆高速免费", "国庆 高速 免费 自驾 堵车", holiday="national_day"),
    _hw("国庆酒店预订", "国庆 酒店 预订 旅游 住宿", holiday="national_day"),
    _hw("黄金周出行", "黄金周 出行 旅游 火车票", holiday="national_day"),
    _hw("春运抢票", "春运 抢票 火车票 回家", holiday="spring"),
    _hw("春节联欢晚会", "春晚 节目 晚会 春节", holiday="spring"),
    _hw("年夜饭预订", "年夜饭 预订 餐厅 春节", holiday="spring"),
    _hw("春节旅游攻略", "春节 旅游 攻略 出游", holiday="spring"),
    _hw("清明祭扫预约", "清明 祭扫 预约 墓园", holiday="qingming"),
    _hw("清明踏青赏花", "清明 踏青 赏花 公园", holiday="qingming"),
    _hw("五一旅游攻略", "五一 劳动节 旅游 攻略 景点", holiday="labour_day"),
    _hw("五一调休安排", "五一 调休 放假 安排", holiday="labour_day"),
    _hw("端午粽子做法", "端午 粽子 口味 做法", holiday="dragon_boat"),
    _hw("端午龙舟比赛", "龙舟 比赛 端午 直播", holiday="dragon_boat"),
    _hw("中秋月饼礼盒", "中秋 月饼 礼盒 口味", holiday="mid_autumn"),
    _hw("中秋赏月地点", "中秋 赏月 月亮 团圆", holiday="mid_autumn"),
    _hw("元旦跨年活动", "元旦 跨年 活动 倒计时", holiday="new_year"),
    _hw("北京故宫预约", "北京 故宫 门票 预约 旅游", province=110000),
    _hw("北京环球影城", "北京 环球影城 门票 攻略", province=110000),
    _hw("北京限行查询", "北京 限行 尾号 查询", province=110000, peak_hour=8),
    _hw("上海迪士尼门票", "上海 迪士尼 门票 攻略", province=310000),
    _hw("上海地铁线路", "上海 地铁 线路 查询", province=310000, peak_hour=8),
    _hw("广州早茶推荐", "广州 早茶 推荐 美食", province=440000, peak_hour=9),
    _hw("深圳天气预报", "深圳 天气 预报 下雨", province=440000, peak_hour=7),
    _hw("成都火锅推荐", "成都 火锅 推荐 美食", province=510000, peak_hour=19),
    _hw("九寨沟旅游", "九寨沟 旅游 门票 攻略", province=510000),
    _hw("杭州西湖游玩", "杭州 西湖 游玩 攻略 旅游", province=330000),
    _hw("天气预报", "天气 预报 明天 下雨", peak_hour=7, base=2.0),
    _hw("股市行情", "股市 行情 大盘 股票", peak_hour=10, base=1.5),
    _hw("外卖优惠券", "外卖 优惠券 红包 美食", peak_hour=12, base=1.5),
    _hw("电视剧推荐", "电视剧 推荐 好看 追剧", peak_hour=21, base=1.5),
    _hw("手机新品发布", "手机 新品 发布 价格"),
    _hw("旅游攻略", "旅游 攻略 景点 推荐", base=1.5),
    _hw("火车票查询", "火车票 查询 时刻表 高铁"),
    _hw("美食推荐", "美食 推荐 附近 餐厅"),
    _hw("英语学习方法", "英语 学习 单词 方法", peak_hour=20),
)
NOISE_TERMS = ("怎么", "什么", "最新", "哪里", "今天", "多少钱", "推荐", "2025")
"""Words users add that say nothing about the hotword."""
_OFF_SEASON = 0.05
_CROSS_PROVINCE = 0.15
_HOME_PROVINCE = 12.0
_NATIONAL_REGIONAL = 0.6


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One search: the query typed, where and when, and the hotword clicked."""

    query: str
    region_id: int
    timestamp_ms: int
    clicked: int


_BASE = np.array([h.base for h in HOTWORDS])
_HOLIDAY_COLUMN = np.array([-1 if h.holiday is None else HOLIDAY_NAMES.index(h.holiday) for h in HOTWORDS])
_PROVINCE_OF = np.array([h.province or 0 for h in HOTWORDS])
_PEAK = np.array([-1 if h.peak_hour is None else h.peak_hour for h in HOTWORDS])
_STOCKS = np.array([h.word == "股市行情" for h in HOTWORDS])


def context_weights(
    closeness: np.ndarray, hour: np.ndarray, weekday: np.ndarray, province: np.ndarray
) -> np.ndarray:
    """Click probabilities of every hotword for N contexts, before the query is known.

    Args:
        closeness: [N, holidays] closeness to each holiday.
        hour, weekday: [N] China time.
        province: [N] province codes, 0 for national.
    """
    n = len(hour)
    weights = np.tile(_BASE, (n, 1))
    seasonal = _HOLIDAY_COLUMN >= 0
    weights[:, seasonal] *= _OFF_SEASON + 10.0 * closeness[:, _HOLIDAY_COLUMN[seasonal]]
    regional = _PROVINCE_OF > 0
    home = province[:, None] == _PROVINCE_OF[None, regional]
    factor = np.where(home, _HOME_PROVINCE, _CROSS_PROVINCE)
    factor[province == 0] = _NATIONAL_REGIONAL
    weights[:, regional] *= factor
    gap = np.abs(hour[:, None] - _PEAK[None, :])
    gap = np.minimum(gap, 24 - gap)
    weights = np.where(_PEAK >= 0, weights * (0.5 + 2.0 * np.exp(-(gap**2) / 8)), weights)
    weights[:, _STOCKS] *= np.where(weekday >= 5, 0.2, 1.0)[:, None]
    return np.asarray(weights / weights.sum(1, keepdims=True))


def _query(rng: np.random.Generator, hotword: Hotword) -> str:
    count = int(rng.integers(1, min(3, len(hotword.terms)) + 1))
    picked = list(rng.choice(len(hotword.terms), size=count, replace=False))
    terms = [hotword.terms[i] for i in sorted(picked)]
    if rng.random() < 0.3:
        terms.append(NOISE_TERMS[int(rng.integers(len(NOISE_TERMS)))])
    return "".join(terms)


_HOURLY = np.array(
    [
        0.3,
        0.2,
        0.1,
        0.1,
        0.1,
        0.2,
        0.5,
        1,
        1.2,
        1.2,
        1.1,
        1.2,
        1.4,
        1.1,
        1,
        1,
        1,
        1.1,
        1.3,
        1.5,
        1.7,
        1.8,
        1.4,
        0.8,
    ]
)
"""Searches by hour of day: few at night, most in the evening."""


def _regions(rng: np.random.Generator, size: int) -> np.ndarray:
    regions = np.asarray(PROVINCES)[rng.integers(len(PROVINCES), size=size)]
    popular = rng.random(size) < 0.5
    regions[popular] = rng.choice([110000, 310000, 440000, 510000, 330000], size=int(popular.sum()))
    regions[rng.random(size) < 0.3] = 0
    return regions


def _sample(rng: np.random.Generator, probabilities: np.ndarray) -> np.ndarray:
    cumulative = probabilities.cumsum(1)
    draws = rng.random(len(probabilities))[:, None] * cumulative[:, -1:]
    return np.asarray(np.minimum((cumulative < draws).sum(1), probabilities.shape[1] - 1))


def generate_log(
    size: int, seed: int, start: dt.date = dt.date(2024, 1, 1), days: int = 731
) -> list[LogRecord]:
    """A deterministic query log: the clicked hotword follows the context (holiday season,
    province, hour, weekday); the query mostly describes it, sometimes another hotword (noise)."""
    rng = np.random.default_rng(seed)
    day_offset = rng.integers(days, size=size)
    hour = rng.choice(24, size=size, p=_HOURLY / _HOURLY.sum())
    minute = rng.integers(60, size=size)
    regions = _regions(rng, size)
    calendar = [start + dt.timedelta(days=d) for d in range(days)]
    closeness = np.array([[holiday_closeness(n, day) for n in HOLIDAY_NAMES] for day in calendar])
    weekday = np.array([day.weekday() for day in calendar])[day_offset]
    clicked = _sample(rng, context_weights(closeness[day_offset], hour, weekday, regions))
    noisy = rng.random(size) >= 0.75
    described = np.where(noisy, rng.integers(len(HOTWORDS), size=size), clicked)
    origin = dt.datetime(start.year, start.month, start.day, tzinfo=CHINA).timestamp()
    stamps = (origin + day_offset * 86400 + hour * 3600 + minute * 60) * 1000
    return [
        LogRecord(_query(rng, HOTWORDS[int(d)]), int(r), int(t), int(c))
        for d, r, t, c in zip(described, regions, stamps, clicked, strict=True)
    ]
