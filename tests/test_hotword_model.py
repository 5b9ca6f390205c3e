"""The hotword answers mean something: holiday seasons, regions, calibrated scores."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from ortserve.apps.hotword.features import Featurizer
from ortserve.apps.hotword.holidays import CHINA
from ortserve.apps.hotword.text import Segmenter, TfIdf
from ortserve.apps.hotword.training import HotwordArtefacts, featurize, train_hotword
from ortserve.apps.hotword.world import generate_log
from ortserve.apps.mlp import train_mlp
from ortserve.apps.seeds import SEED_APPS
from ortserve.testing import PipelineHarness, pipeline_harness

HOLIDAY_TRAVEL = {"国庆旅游攻略", "国庆酒店预订", "黄金周出行", "国庆高速免费"}
BEIJING = {"北京故宫预约", "北京环球影城", "北京限行查询"}


def at(year: int, month: int, day: int, hour: int = 10) -> int:
    return int(dt.datetime(year, month, day, hour, tzinfo=CHINA).timestamp() * 1000)


@pytest.fixture(scope="module")
def hotword_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hotword_repo")
    train_hotword(root / "hotword" / "1")
    (root / "hotword" / "config.yaml").write_text(SEED_APPS["hotword"][1], encoding="utf-8")
    return root


@pytest.fixture
async def harness(hotword_repository: Path) -> AsyncIterator[PipelineHarness]:
    async with pipeline_harness(hotword_repository) as loaded:
        yield loaded


def scores(answer: dict[str, Any]) -> dict[str, float]:
    return {h["word"]: h["score"] for h in answer["hotwords"]}


async def test_near_national_day_a_travel_query_ranks_holiday_travel_hotwords_higher(
    harness: PipelineHarness,
) -> None:
    golden: Any = await harness.call("hotword", {"query": "国庆旅游攻略", "timestamp": at(2025, 9, 27)})
    march: Any = await harness.call("hotword", {"query": "国庆旅游攻略", "timestamp": at(2026, 3, 11)})
    near, ordinary = scores(golden), scores(march)
    assert set(list(near)[:2]) <= HOLIDAY_TRAVEL
    ordinary_rank = list(ordinary).index("国庆旅游攻略") if "国庆旅游攻略" in ordinary else len(ordinary)
    assert list(near).index("国庆旅游攻略") < ordinary_rank
    assert near["国庆旅游攻略"] > 2 * ordinary.get("国庆旅游攻略", 0.0)
    assert sum(near.get(w, 0.0) for w in HOLIDAY_TRAVEL) > sum(ordinary.get(w, 0.0) for w in HOLIDAY_TRAVEL)
    assert all("holiday" in h["tags"] for h in golden["hotwords"] if h["word"] in HOLIDAY_TRAVEL)
    assert not any("holiday" in h["tags"] for h in march["hotwords"])


async def test_a_beijing_region_lifts_beijing_hotwords_and_tags_them_regional(
    harness: PipelineHarness,
) -> None:
    query = {"query": "旅游攻略门票", "timestamp": at(2026, 3, 11)}
    beijing: Any = await harness.call("hotword", {**query, "region_id": 110105})
    shanghai: Any = await harness.call("hotword", {**query, "region_id": 310000})
    in_beijing, in_shanghai = scores(beijing), scores(shanghai)
    assert set(list(in_beijing)[:2]) <= BEIJING
    assert sum(in_beijing.get(w, 0.0) for w in BEIJING) > 3 * sum(in_shanghai.get(w, 0.0) for w in BEIJING)
    tagged = {h["word"] for h in beijing["hotwords"] if "regional" in h["tags"]}
    assert tagged and tagged <= BEIJING
    assert not any("regional" in h["tags"] and h["word"] in BEIJING for h in shanghai["hotwords"])


async def test_answers_are_ranked_scores_between_0_and_1_with_the_model_version(
    harness: PipelineHarness,
) -> None:
    answer: Any = await harness.post("/v1/predict", '{"query": "天气", "timestamp": 1759017600000}'.encode())
    values = list(scores(answer).values())
    assert values == sorted(values, reverse=True) and all(0.0 <= v <= 1.0 for v in values)
    assert answer["model_version"] == "1"


def test_scores_are_calibrated_on_a_held_out_log(hotword_repository: Path) -> None:
    version_dir = hotword_repository / "hotword" / "1"
    artefacts = HotwordArtefacts.load(version_dir)
    log = generate_log(4000, seed=2024)
    x = featurize(log, Segmenter(version_dir), Featurizer(TfIdf(artefacts.vocabulary, artefacts.idf)))
    predicted = ort.InferenceSession(str(version_dir / "model.onnx")).run(None, {"features": x})[0]
    clicked = np.zeros_like(predicted)
    clicked[np.arange(len(log)), [r.clicked for r in log]] = 1.0
    bins = np.minimum((predicted * 10).astype(int), 9)
    gaps = [
        abs(predicted[bins == b].mean() - clicked[bins == b].mean()) * (bins == b).sum()
        for b in range(10)
        if (bins == b).any()
    ]
    expected_calibration_error = sum(gaps) / predicted.size
    assert expected_calibration_error < 0.02
    assert np.allclose(predicted.sum(1).mean(), 1.0, atol=0.1)


def test_the_log_and_the_training_are_deterministic_for_a_seed() -> None:
    assert generate_log(200, seed=5) == generate_log(200, seed=5)
    assert generate_log(200, seed=5) != generate_log(200, seed=6)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 6)).astype(np.float32)
    y = (x[:, :1] > 0).astype(np.float32)
    first, second = train_mlp(x, y, 8, 3, seed=1), train_mlp(x, y, 8, 3, seed=1)
    assert np.array_equal(first.w1, second.w1) and np.array_equal(first.w2, second.w2)
