"""One candidate's feature row: how the query matches it, whether its region is the searcher's,
how in season it is, how popular it is; plus the ablated rows that attribute tags.

A tag is earned, not declared: the row is scored again with the tag's features switched off
(as if the hotword had no region, or no season), and the tag holds only when that drops the
score enough (see ``pipeline.TAG_DROP``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ortserve.apps.hotword.corpus import Entry, SeasonCalendar
from ortserve.apps.hotword.regions import RegionTable, province_of
from ortserve.apps.hotword.retrieval import Matches

__all__ = ["ABLATIONS", "FEATURE_NAMES", "TAG_ACTIVE", "Featurizer", "Rows"]

FEATURE_NAMES = (
    "exact",
    "word_query",
    "word_entry",
    "bigram_query",
    "bigram_entry",
    "region_home",
    "region_nearby",
    "region_away",
    "region_unplaced",
    "holiday_closeness",
    "holiday_off",
    "event_closeness",
    "event_off",
    "log_base",
)
_COLUMN = {name: i for i, name in enumerate(FEATURE_NAMES)}
ABLATIONS = {
    "holiday": (_COLUMN["holiday_closeness"], _COLUMN["holiday_off"]),
    "regional": (
        _COLUMN["region_home"],
        _COLUMN["region_nearby"],
        _COLUMN["region_away"],
        _COLUMN["region_unplaced"],
    ),
    "trending": (_COLUMN["event_closeness"], _COLUMN["event_off"]),
}
"""Tag -> the feature columns switched off to measure what the tag's feature added."""
TAG_ACTIVE = {"holiday": "holiday_closeness", "regional": "region_home", "trending": "event_closeness"}
"""A tag is only considered where its feature is on (at least 0.2) for the candidate."""
_ACTIVE_AT = 0.2


@dataclass(frozen=True, slots=True)
class Rows:
    """Model input: the candidates' rows, then one ablated row per (tag, candidate) in ``probes``."""

    matrix: npt.NDArray[np.float32]
    probes: list[tuple[str, int]]
    """(tag, candidate position) of each row after the first ``len(candidates)``."""


class Featurizer:
    """Feature rows of a corpus's candidates for a searcher's region and day.

    Args:
        entries: the corpus.
        calendar: the corpus's season calendar (shared with the log generator in training).
    """

    def __init__(self, entries: Sequence[Entry], calendar: SeasonCalendar | None = None) -> None:
        self.calendar = calendar or SeasonCalendar(entries)
        self._regions = np.array([e.region for e in entries], dtype=np.int64)
        self._localities = RegionTable(self._regions)
        self._log_base = np.log(np.array([e.base for e in entries]))
        self._holiday = np.array([e.season is not None and e.season[0] == "holiday" for e in entries])
        self._event = np.array([e.season is not None and e.season[0] == "event" for e in entries])

    def rows(self, matches: Matches, region_id: int, day: dt.date) -> Rows:
        """The candidates' rows and, for each tag whose feature is on, an ablated copy.

        ``region_home`` is the searcher's city (or province, where either side names only
        that), ``region_nearby`` another city of the searcher's province (see
        :func:`~ortserve.apps.hotword.regions.locality`)."""
        index = matches.index
        region = self._regions[index]
        regional = region != 0
        province = province_of(region_id)
        local = self._localities.locality(region_id)[index]
        home, nearby = local == 1.0, (local > 0) & (local < 1.0)
        away = regional & (local == 0) & (province is not None)
        closeness = self.calendar.closeness(day)[index]
        holiday, event = self._holiday[index], self._event[index]
        columns = (
            matches.exact,
            matches.word_query,
            matches.word_entry,
            matches.bigram_query,
            matches.bigram_entry,
            home,
            nearby,
            away,
            regional & (province is None),
            np.where(holiday, closeness, 0.0),
            holiday & (closeness == 0),
            np.where(event, closeness, 0.0),
            event & (closeness == 0),
            self._log_base[index],
        )
        base = np.stack([np.asarray(c, dtype=np.float32) for c in columns], axis=1)
        blocks, probes = [base], []
        for tag, switched_off in ABLATIONS.items():
            active = np.flatnonzero(base[:, _COLUMN[TAG_ACTIVE[tag]]] >= _ACTIVE_AT)
            if len(active):
                block = base[active].copy()
                block[:, list(switched_off)] = 0.0
                blocks.append(block)
                probes += [(tag, int(i)) for i in active]
        return Rows(np.concatenate(blocks) if len(blocks) > 1 else base, probes)
