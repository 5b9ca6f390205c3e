"""The hotword pipeline: retrieve the corpus entries a query relates to, score them with the
ranker (region and season features), rank, and tag what the features earned.

An answer is ``{"matched": bool, "hotwords": [...]}``: ``matched`` is false, with no hotwords,
when the query relates to nothing in the corpus. A query that is itself a hotword lists that
hotword first. Tags are attributions: a tag holds only when switching its feature off lowers
the hotword's score by at least ``TAG_DROP`` of it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ortserve.apps.hotword.corpus import CORPUS, Entry, load_corpus
from ortserve.apps.hotword.features import FEATURE_NAMES, Featurizer, Rows
from ortserve.apps.hotword.holidays import china_time
from ortserve.apps.hotword.request import HotwordRequest, parse_hotword_request
from ortserve.apps.hotword.retrieval import Index, Matches
from ortserve.apps.hotword.text import Segmenter
from ortserve.apps.hotword.training import ARTEFACTS, INPUT, OUTPUT
from ortserve.errors import ConfigError
from ortserve.pipeline.contract import JsonObject, ModelCall, ModelOutputs, PipelineContext

__all__ = ["MIN_SCORE", "MIN_SHARE", "TAG_DROP", "TAG_LABELS", "HotwordPipeline"]

TAG_DROP = 0.25
"""A tag holds when its feature switched off costs at least this share of the score."""
MIN_SCORE = 0.01
"""Hotwords the ranker scores under this are not answered: they filled places 2-5 with
noise (冰雪大世界 for 世界杯 at 0.0, 大庆旅游攻略 for 国庆旅游攻略 at 0.008). An exact match
is always answered."""
MIN_SHARE = 0.2
"""... nor those under this share of the best other hotword's score: the floor follows the
ranker's calibration for the query (大庆旅游攻略 at 0.011 beside 中秋旅游攻略 at 0.082)."""
TAG_LABELS = {"holiday": "节假日", "regional": "地域热点", "trending": "热门趋势"}
"""Each tag's label (``tags``) by its English alias (``tag_ids``)."""


@dataclass(slots=True)
class _Prepared:
    """A request and its candidates, carried from preprocess to postprocess."""

    request: HotwordRequest
    matches: Matches | None = None
    rows: Rows | None = None


class HotwordPipeline:
    """``POST /v1/predict``: query, region and time in; related hotwords, ranked and tagged, out.

    Args:
        context: the ``hotword`` model's version folder holds the corpus, the tokenizer's
            dictionary and the feature list the model was trained on; all are read here, so
            reloading the model rebuilds the corpus too.
    """

    route: str | None = "/v1/predict"

    def __init__(self, context: PipelineContext) -> None:
        trained = json.loads((context.version_dir / ARTEFACTS).read_text(encoding="utf-8"))
        if trained.get("features") != list(FEATURE_NAMES):
            raise ConfigError(
                f"{context.version_dir / ARTEFACTS}: the model's features are not this pipeline's"
            )
        self._model = context.model_name
        self._version = context.model_version
        self._entries: list[Entry] = load_corpus(context.version_dir / CORPUS)
        self._index = Index(self._entries, Segmenter(context.version_dir).search)
        self._featurizer = Featurizer(self._entries)

    def parse(self, document: object) -> _Prepared:
        return _Prepared(parse_hotword_request(document))

    def preprocess(self, prepared: _Prepared) -> list[ModelCall]:
        request = prepared.request
        prepared.matches = self._index.match(request.query, request.region_id)
        if not len(prepared.matches.index):
            return []
        day = china_time(request.timestamp_ms).date()
        prepared.rows = self._featurizer.rows(prepared.matches, request.region_id, day)
        return [ModelCall(self._model, {INPUT: prepared.rows.matrix})]

    def postprocess(self, outputs: Sequence[ModelOutputs], prepared: _Prepared) -> JsonObject:
        answer: JsonObject = {"matched": False, "hotwords": []}
        answer |= {"model_version": self._version, "region_id": prepared.request.region_id}
        matches, rows = prepared.matches, prepared.rows
        if matches is None or rows is None:
            return answer
        scores = np.asarray(outputs[0][OUTPUT], dtype=np.float64)[:, 0]
        count = len(matches.index)
        order = np.lexsort((np.arange(count), -scores[:count], -matches.exact))
        ranked = _answered(scores[:count], matches, order.tolist(), prepared.request.top_k)
        if not ranked:
            return answer
        tags = _attributions(scores, count, rows.probes)
        answer["matched"] = True
        answer["hotwords"] = [
            self._hotword(int(matches.index[i]), float(scores[i]), tags.get(int(i), [])) for i in ranked
        ]
        return answer

    def _hotword(self, entry: int, score: float, tag_ids: list[str]) -> JsonObject:
        found = self._entries[entry]
        return {
            "word": found.word,
            "score": round(score, 4),
            "category": found.category,
            "tags": [TAG_LABELS[t] for t in tag_ids],
            "tag_ids": tag_ids,
        }

    def example(self) -> JsonObject:
        return {"query": "国庆旅游攻略", "region_id": 110000, "timestamp": 1759017600000}


def _answered(scores: np.ndarray, matches: Matches, ranked: list[int], top_k: int) -> list[int]:
    """The ranked candidates to answer, at most ``top_k``: an exact match and the best one
    always; others scoring at least ``MIN_SCORE`` and ``MIN_SHARE`` of the best other, and
    never one related by character pairs alone (冰雪大世界 to 世界杯) while another shares a
    whole word with the query. The floor trims padding, never the answer itself: a query that
    relates to something (兰州地铁多少钱, its filler lowering every score) gets its best hotword.

    A walk over the ranking that stops at ``top_k``: a handful of comparisons, where masks
    over every candidate cost 20 us a request in NumPy's per-call overhead."""
    exact = matches.exact.tolist()
    worded = (matches.word_query > 0).tolist()
    any_worded = any(worded)
    others = scores[matches.exact == 0]
    floor = max(MIN_SCORE, MIN_SHARE * float(others.max())) if len(others) else MIN_SCORE
    values = scores.tolist()
    chosen: list[int] = []
    for position, i in enumerate(ranked):
        related = worded[i] or not any_worded
        if exact[i] > 0 or (related and (position == 0 or values[i] >= floor)):
            chosen.append(i)
            if len(chosen) == top_k:
                break
    return chosen


def _attributions(scores: np.ndarray, count: int, probes: list[tuple[str, int]]) -> dict[int, list[str]]:
    """Candidate position -> the tags whose ablated score fell by at least ``TAG_DROP``."""
    tags: dict[int, list[str]] = {}
    for row, (tag, position) in enumerate(probes, start=count):
        full = scores[position]
        if full > 0 and (full - scores[row]) >= TAG_DROP * full:
            tags.setdefault(position, []).append(tag)
    return tags
