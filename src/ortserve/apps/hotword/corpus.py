"""The hotword corpus: what users can be suggested, with category, region and seasonality.

The seed corpus ships as package data (``data/corpus.tsv``, written by
``scripts/gen_hotword_corpus.py``); training copies it into the model's version folder, and the
pipeline reads it from there when it is built, so a reload of the model reloads the corpus.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ortserve.apps.hotword.holidays import HOLIDAY_NAMES, LEAD_DAYS, holiday_closeness
from ortserve.errors import ConfigError

__all__ = ["CORPUS", "Entry", "SeasonCalendar", "copy_seed_corpus", "load_corpus", "season_closeness"]

CORPUS = "corpus.tsv"
_HEADER = ["word", "terms", "category", "region", "season", "base"]
MAX_ENTRIES = 100_000


@dataclass(frozen=True, slots=True)
class Entry:
    """One hotword. ``season`` is ``("holiday", key)``, ``("event", "MM-DD:MM-DD")`` or None."""

    word: str
    terms: tuple[str, ...]
    category: str
    region: int
    season: tuple[str, str] | None
    base: float


def _season(text: str, where: str) -> tuple[str, str] | None:
    if not text:
        return None
    kind, _, rest = text.partition(":")
    if kind == "holiday" and rest in HOLIDAY_NAMES:
        return kind, rest
    if kind == "event":
        start, _, end = rest.partition(":")
        try:
            dt.date.fromisoformat(f"2023-{start}"), dt.date.fromisoformat(f"2023-{end}")
        except ValueError:
            raise ConfigError(f"{where}: season {text!r} is not event:MM-DD:MM-DD") from None
        return kind, rest
    raise ConfigError(
        f"{where}: season {text!r} is not holiday:<{'|'.join(HOLIDAY_NAMES)}> or event:MM-DD:MM-DD"
    )


def _entry(fields: list[str], where: str) -> Entry:
    if len(fields) != len(_HEADER):
        raise ConfigError(f"{where}: expected {len(_HEADER)} tab-separated fields, got {len(fields)}")
    word, terms, category, region, season, base = fields
    try:
        code, weight = int(region), float(base)
    except ValueError:
        raise ConfigError(f"{where}: region must be an integer and base a number") from None
    if not word or not math.isfinite(weight) or weight <= 0:
        raise ConfigError(f"{where}: a hotword needs a word and a positive base")
    return Entry(word, tuple(terms.split()), category, code, _season(season, where), weight)


def load_corpus(path: Path) -> list[Entry]:
    """Every entry of a corpus file, in file order.

    Raises:
        ConfigError: naming the file and line, for a malformed header or row, or a word twice.
    """
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines or lines[0].split("\t") != _HEADER:
        raise ConfigError(f"{path}: the first line must be the header {chr(9).join(_HEADER)!r}")
    if len(lines) - 1 > MAX_ENTRIES:
        raise ConfigError(f"{path}: more than {MAX_ENTRIES} hotwords")
    entries = [_entry(line.split("\t"), f"{path}:{n}") for n, line in enumerate(lines[1:], 2) if line]
    words = [e.word for e in entries]
    if len(set(words)) != len(words):
        raise ConfigError(f"{path}: a hotword appears twice")
    return entries


def copy_seed_corpus(version_dir: Path) -> Path:
    """Copy the shipped corpus into a model version folder."""
    target = version_dir / CORPUS
    with resources.as_file(resources.files("ortserve.apps.hotword") / "data" / CORPUS) as source:
        shutil.copyfile(source, target)
    return target


@functools.lru_cache(maxsize=4096)
def _bounds(window: str) -> tuple[int, int, int, int]:
    start, _, end = window.partition(":")
    (m1, d1), (m2, d2) = (map(int, start.split("-")), map(int, end.split("-")))
    return m1, d1, m2, d2


def _event_closeness(window: str, day: dt.date) -> float:
    """1 inside the window, building over ``LEAD_DAYS`` before it, else 0 (windows may wrap)."""
    m1, d1, m2, d2 = _bounds(window)
    best = 0.0
    for year in (day.year - 1, day.year, day.year + 1):
        first = dt.date(year, m1, d1)
        last = dt.date(year if (m2, d2) >= (m1, d1) else year + 1, m2, d2)
        if first <= day <= last:
            return 1.0
        until = (first - day).days
        if 0 < until <= LEAD_DAYS:
            best = max(best, math.exp(-until / 7))
    return best


def season_closeness(season: tuple[str, str] | None, day: dt.date) -> float:
    """How much in season an entry is on ``day``: 0 off season (or never seasonal), 1 at its peak."""
    if season is None:
        return 0.0
    kind, value = season
    return holiday_closeness(value, day) if kind == "holiday" else _event_closeness(value, day)


class SeasonCalendar:
    """Every entry's season closeness by day, computed once per day and kept for a few years.

    Args:
        entries: the corpus.
    """

    CACHED_DAYS = 1024
    """About 2 KB per day for the seed corpus's seasonal entries."""

    def __init__(self, entries: Sequence[Entry]) -> None:
        self._entries = entries
        self.seasonal = np.flatnonzero([e.season is not None for e in entries])
        self._days: dict[dt.date, npt.NDArray[np.float64]] = {}

    def closeness(self, day: dt.date) -> npt.NDArray[np.float64]:
        """A vector over all entries: 0 for entries without a season."""
        cached = self._days.get(day)
        if cached is None:
            cached = np.array(
                [season_closeness(self._entries[i].season, day) for i in self.seasonal.tolist()]
            )
            if len(self._days) >= self.CACHED_DAYS:
                self._days.pop(next(iter(self._days)))
            self._days[day] = cached
        full = np.zeros(len(self._entries))
        full[self.seasonal] = cached
        return full
