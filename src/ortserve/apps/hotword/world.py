"""The synthetic search world the hotword model learns from: a seeded query log over the corpus.

Each search has a context (province or national, a day, an hour) and an intent drawn from the
corpus by popularity, region and season; the query typed is the intent's word, some of its
parts, or a synonym, sometimes with filler words. A query that spells another hotword exactly
means that hotword (what a search box would complete it to).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ortserve.apps.hotword.corpus import Entry, SeasonCalendar
from ortserve.apps.hotword.holidays import CHINA
from ortserve.apps.hotword.retrieval import normalise

__all__ = ["PROVINCES", "LogRecord", "context_weights", "generate_log", "province_of"]

PROVINCES = (
    110000, 120000, 130000, 140000, 150000, 210000, 220000, 230000, 310000, 320000, 330000, 340000,
    350000, 360000, 370000, 410000, 420000, 430000, 440000, 450000, 460000, 500000, 510000, 520000,
    530000, 540000, 610000, 620000, 630000, 640000, 650000, 710000, 810000, 820000,
)  # fmt: skip
"""Province-level administrative codes; a city or district code maps to its province."""
FILLERS = ("怎么", "最新", "哪里", "今天", "多少钱", "2025")
_OFF_SEASON = 0.05
_IN_SEASON = 10.0
_AWAY = 0.15
_HOME = 12.0
_UNPLACED = 0.6


def province_of(region_id: int) -> int | None:
    """The province code of an administrative code (0, national, has none)."""
    code = region_id // 10000 * 10000
    return code if code in PROVINCES else None


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One search: the query typed, where and when, and the corpus index of the hotword clicked."""

    query: str
    region_id: int
    timestamp_ms: int
    clicked: int


def context_weights(
    regions: npt.NDArray[np.int64],
    base: npt.NDArray[np.float64],
    closeness: npt.NDArray[np.float64],
    seasonal: npt.NDArray[np.bool_],
    province: int,
) -> npt.NDArray[np.float64]:
    """Every entry's intent weight in one context (province 0: national)."""
    region_factor = np.ones(len(regions))
    regional = regions != 0
    if province == 0:
        region_factor[regional] = _UNPLACED
    else:
        region_factor[regional] = np.where(regions[regional] == province, _HOME, _AWAY)
    season_factor = np.where(seasonal, _OFF_SEASON + _IN_SEASON * closeness, 1.0)
    return base * region_factor * season_factor


def _parts(entry: Entry) -> tuple[list[str], list[str]]:
    """The parts the word is made of, in word order, and the synonyms (terms not in the word)."""
    inside = sorted((t for t in entry.terms if t in entry.word), key=entry.word.find)
    return inside, [t for t in entry.terms if t not in entry.word]


def _query(rng: np.random.Generator, entry: Entry) -> str:
    parts, synonyms = _parts(entry)
    draw = rng.random()
    if draw < 0.25 or not parts:
        text = entry.word
    else:
        keep = sorted(rng.choice(len(parts), size=int(rng.integers(1, len(parts) + 1)), replace=False))
        words = [parts[int(i)] for i in keep]
        if draw > 0.8 and synonyms:
            words[0] = synonyms[int(rng.integers(len(synonyms)))]
        text = "".join(words)
    if rng.random() < 0.2:
        text += FILLERS[int(rng.integers(len(FILLERS)))]
    return text


def generate_log(
    entries: Sequence[Entry], size: int, seed: int, days: int = 731, calendar: SeasonCalendar | None = None
) -> list[LogRecord]:
    """A deterministic log over ``days`` from 2024-01-01: intents follow the context."""
    calendar = calendar or SeasonCalendar(entries)
    rng = np.random.default_rng(seed)
    start = dt.date(2024, 1, 1)
    regions = np.array([e.region for e in entries], dtype=np.int64)
    base = np.array([e.base for e in entries])
    seasonal = np.array([e.season is not None for e in entries])
    exact = {normalise(e.word): i for i, e in enumerate(entries)}
    origin = dt.datetime(2024, 1, 1, tzinfo=CHINA).timestamp()
    records = []
    for _ in range(size):
        offset = int(rng.integers(days))
        province = 0 if rng.random() < 0.3 else int(PROVINCES[int(rng.integers(len(PROVINCES)))])
        closeness = calendar.closeness(start + dt.timedelta(days=offset))
        weights = context_weights(regions, base, closeness, seasonal, province)
        intent = int(np.searchsorted(np.cumsum(weights), rng.random() * weights.sum(), side="right"))
        intent = min(intent, len(entries) - 1)
        query = _query(rng, entries[intent])
        clicked = exact.get(normalise(query), intent)
        stamp = (origin + offset * 86400 + int(rng.integers(86400))) * 1000
        records.append(LogRecord(query, province, int(stamp), clicked))
    return records
