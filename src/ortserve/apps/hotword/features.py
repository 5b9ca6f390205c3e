"""One search's feature vector: TF-IDF of the query, province one-hot, calendar features."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from ortserve.apps.hotword.holidays import HOLIDAY_NAMES, calendar_features
from ortserve.apps.hotword.text import TfIdf
from ortserve.apps.hotword.world import PROVINCES, province_of

__all__ = ["Featurizer"]

_PROVINCE_INDEX = {code: i for i, code in enumerate(PROVINCES)}
_CONTEXT = len(PROVINCES) + 1 + 2 + 7 + len(HOLIDAY_NAMES) + 1


class Featurizer:
    """Writes feature rows for tokens, region and timestamp.

    Args:
        tfidf: the vocabulary and IDF learned at training.
    """

    def __init__(self, tfidf: TfIdf) -> None:
        self.tfidf = tfidf
        self.width = len(tfidf.vocabulary) + _CONTEXT

    def row(self, tokens: list[str], region_id: int, timestamp_ms: int) -> npt.NDArray[np.float32]:
        """A [1, width] float32 row."""
        out = np.zeros((1, self.width), dtype=np.float32)
        self.write(out[0], tokens, region_id, timestamp_ms)
        return out

    def write(
        self, out: npt.NDArray[np.float32], tokens: list[str], region_id: int, timestamp_ms: int
    ) -> None:
        """Fill one preallocated row."""
        vocabulary = len(self.tfidf.vocabulary)
        self.tfidf.transform(tokens, out[:vocabulary])
        context = out[vocabulary:]
        context[:] = 0
        province = province_of(region_id)
        if province is None:
            context[len(PROVINCES)] = 1.0
        else:
            context[_PROVINCE_INDEX[province]] = 1.0
        at = len(PROVINCES) + 1
        calendar = calendar_features(timestamp_ms)
        angle = 2 * math.pi * calendar.hour / 24
        context[at : at + 2] = (math.sin(angle), math.cos(angle))
        context[at + 2 + calendar.weekday] = 1.0
        at += 9
        context[at : at + len(HOLIDAY_NAMES)] = calendar.closeness
        context[at + len(HOLIDAY_NAMES)] = math.exp(-calendar.days_to_nearest / 14)
