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
from ortserve.apps.hotword.regions import NEARBY, PROVINCES, city_of, locality, province_of
from ortserve.apps.hotword.retrieval import normalise

__all__ = ["PROVINCES", "LogRecord", "context_weights", "generate_log", "province_of"]

FILLERS = ("怎么", "最新", "哪里", "今天", "多少钱", "2025")
_OFF_SEASON = 0.05
_IN_SEASON = 10.0
_AWAY = 0.15
_HOME = 12.0
_CITY_SEARCHERS = 0.6
"""Share of a province's searchers the log places in one of its cities (the rest: province only)."""
_UNPLACED = 0.6


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
    region_id: int,
) -> npt.NDArray[np.float64]:
    """Every entry's intent weight in one context (region 0: national; a province or a city)."""
    region_factor = np.ones(len(regions))
    regional = regions != 0
    if region_id == 0:
        region_factor[regional] = _UNPLACED
    else:
        local = locality(regions, region_id)[regional]
        # At home 12x, nearby (another city of the province) NEARBY of that, elsewhere 0.15x.
        region_factor[regional] = np.where(local > 0, _HOME * np.where(local < 1, NEARBY, 1.0), _AWAY)
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
    cities = {
        p: sorted({int(r) for r in regions if city_of(int(r)) and province_of(int(r)) == p})
        for p in PROVINCES
    }
    base = np.array([e.base for e in entries])
    seasonal = np.array([e.season is not None for e in entries])
    exact = {normalise(e.word): i for i, e in enumerate(entries)}
    origin = dt.datetime(2024, 1, 1, tzinfo=CHINA).timestamp()
    records = []
    for _ in range(size):
        offset = int(rng.integers(days))
        province = 0 if rng.random() < 0.3 else int(PROVINCES[int(rng.integers(len(PROVINCES)))])
        region = province
        if province and cities[province] and rng.random() < _CITY_SEARCHERS:
            region = cities[province][int(rng.integers(len(cities[province])))]
        closeness = calendar.closeness(start + dt.timedelta(days=offset))
        weights = context_weights(regions, base, closeness, seasonal, region)
        intent = int(np.searchsorted(np.cumsum(weights), rng.random() * weights.sum(), side="right"))
        intent = min(intent, len(entries) - 1)
        query = _query(rng, entries[intent])
        clicked = exact.get(normalise(query), intent)
        stamp = (origin + offset * 86400 + int(rng.integers(86400))) * 1000
        records.append(LogRecord(query, region, int(stamp), clicked))
    return records
