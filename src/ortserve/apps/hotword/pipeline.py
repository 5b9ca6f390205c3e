"""The hotword pipeline: segment and featurize a search, score every hotword, rank and tag."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ortserve.apps.hotword.features import Featurizer
from ortserve.apps.hotword.holidays import china_time, holiday_closeness
from ortserve.apps.hotword.request import HotwordRequest, parse_hotword_request
from ortserve.apps.hotword.text import Segmenter, TfIdf
from ortserve.apps.hotword.training import INPUT, OUTPUT, HotwordArtefacts
from ortserve.apps.hotword.world import HOTWORDS, Hotword, province_of
from ortserve.pipeline.contract import JsonObject, ModelCall, ModelOutputs, PipelineContext

__all__ = ["TOP_K", "HotwordPipeline"]

TOP_K = 5
HOLIDAY_TAG_CLOSENESS = 0.2
"""A holiday hotword is tagged ``holiday`` within about 11 days before its holiday."""
TRENDING_LIFT = 2.0
"""A hotword is ``trending`` when scored at least this many times its base rate."""


class HotwordPipeline:
    """``POST /v1/predict``: query, region and time in; ranked, scored, tagged hotwords out.

    Args:
        context: the ``hotword`` model's version folder holds the dictionary and artefacts.
    """

    route = "/v1/predict"

    def __init__(self, context: PipelineContext) -> None:
        artefacts = HotwordArtefacts.load(context.version_dir)
        self._model = context.model_name
        self._version = context.model_version
        self._segmenter = Segmenter(context.version_dir)
        self._featurizer = Featurizer(TfIdf(artefacts.vocabulary, artefacts.idf))
        by_word = {h.word: h for h in HOTWORDS}
        self._hotwords: list[Hotword | None] = [by_word.get(word) for word in artefacts.hotwords]
        self._words = artefacts.hotwords
        self._prior = np.asarray(artefacts.prior, dtype=np.float32)

    def parse(self, document: object) -> HotwordRequest:
        return parse_hotword_request(document)

    def preprocess(self, request: HotwordRequest) -> list[ModelCall]:
        tokens = self._segmenter.cut(request.query)
        row = self._featurizer.row(tokens, request.region_id, request.timestamp_ms)
        return [ModelCall(self._model, {INPUT: row})]

    def postprocess(self, outputs: Sequence[ModelOutputs], request: HotwordRequest) -> JsonObject:
        scores = outputs[0][OUTPUT][0]
        top = np.argsort(-scores, kind="stable")[:TOP_K]
        return {
            "hotwords": [
                {
                    "word": self._words[i],
                    "score": round(float(scores[i]), 4),
                    "tags": self._tags(int(i), float(scores[i]), request),
                }
                for i in top
            ],
            "model_version": self._version,
            "region_id": request.region_id,
        }

    def example(self) -> JsonObject:
        return {"query": "国庆旅游攻略", "region_id": 110000, "timestamp": 1759017600000}

    def _tags(self, index: int, score: float, request: HotwordRequest) -> list[str]:
        tags = []
        hotword = self._hotwords[index]
        if hotword is not None and hotword.holiday is not None:
            day = china_time(request.timestamp_ms).date()
            if holiday_closeness(hotword.holiday, day) >= HOLIDAY_TAG_CLOSENESS:
                tags.append("holiday")
        if hotword is not None and hotword.province == province_of(request.region_id) is not None:
            tags.append("regional")
        if score >= TRENDING_LIFT * float(self._prior[index]):
            tags.append("trending")
        return tags
