"""The hotword service follows the query: every hotword queried ranks itself first wherever and
whenever it is asked, unrelated queries say so, tags are earned, context ranks the rest."""

from __future__ import annotations

import datetime as dt
import importlib.util
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from ortserve.apps.hotword.corpus import CORPUS, load_corpus
from ortserve.apps.hotword.features import ABLATIONS, Featurizer
from ortserve.apps.hotword.holidays import CHINA
from ortserve.apps.hotword.pipeline import MIN_SCORE, TAG_DROP, TAG_LABELS, HotwordPipeline
from ortserve.apps.hotword.regions import NEARBY, locality
from ortserve.apps.hotword.retrieval import Index
from ortserve.apps.hotword.text import Segmenter
from ortserve.apps.hotword.training import OUTPUT, examples
from ortserve.apps.hotword.world import PROVINCES, generate_log
from ortserve.apps.mlp import train_mlp
from ortserve.errors import ConfigError
from ortserve.pipeline.contract import PipelineContext

REPO_ROOT = Path(__file__).resolve().parent.parent.parent.parent
DATES = [
    dt.date(2025, 1, 20),
    dt.date(2025, 4, 2),
    dt.date(2025, 6, 22),
    dt.date(2025, 9, 28),
    dt.date(2025, 11, 5),
]


def at(day: dt.date, hour: int = 10) -> int:
    return int(dt.datetime(day.year, day.month, day.day, hour, tzinfo=CHINA).timestamp() * 1000)


class Ranker:
    """The pipeline's own steps around a real ONNX Runtime session, without the server."""

    def __init__(self, version_dir: Path) -> None:
        self.version_dir = version_dir
        self.pipeline = HotwordPipeline(PipelineContext("hotword", "1", version_dir))
        self.session = ort.InferenceSession(
            str(version_dir / "model.onnx"), providers=["CPUExecutionProvider"]
        )

    def score(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(self.session.run(None, {"features": rows})[0])[:, 0]

    def ask(self, query: str, region: int, day: dt.date, top_k: int = 5) -> dict[str, Any]:
        prepared = self.pipeline.parse(
            {"query": query, "region_id": region, "timestamp": at(day), "top_k": top_k}
        )
        calls = self.pipeline.preprocess(prepared)
        outputs = [{OUTPUT: self.session.run(None, dict(call.inputs))[0]} for call in calls]
        return self.pipeline.postprocess(outputs, prepared)


@pytest.fixture(scope="module")
def ranker(demo_repository: Path) -> Ranker:
    return Ranker(demo_repository / "hotword" / "1")


def words(answer: dict[str, Any]) -> list[str]:
    return [h["word"] for h in answer["hotwords"]]


def test_every_hotword_used_as_the_query_ranks_itself_first(ranker: Ranker) -> None:
    entries = load_corpus(ranker.version_dir / CORPUS)
    regions = [0, *PROVINCES]
    for i, entry in enumerate(entries):
        answer = ranker.ask(entry.word, regions[i % len(regions)], DATES[i % len(DATES)])
        assert answer["matched"] and words(answer)[0] == entry.word


def test_a_hotword_ranks_itself_first_in_every_region_on_every_date(ranker: Ranker) -> None:
    entries = load_corpus(ranker.version_dir / CORPUS)
    picked = [e for e in entries if e.region or e.season][::300] + [
        e for e in entries if e.word == "旅游攻略"
    ]
    for entry in picked:
        for region in (0, *PROVINCES):
            for day in DATES[::2]:
                assert words(ranker.ask(entry.word, region, day, top_k=1)) == [entry.word]


@pytest.mark.parametrize("query", ["量子计算机原理", "如何学习拉丁语语法", "黑洞蒸发", "qwertyzx"])
def test_a_query_unrelated_to_the_corpus_says_so(ranker: Ranker, query: str) -> None:
    answer = ranker.ask(query, 110000, DATES[3])
    assert answer["matched"] is False and answer["hotwords"] == []


def test_the_seed_example_puts_the_queried_hotword_first(ranker: Ranker) -> None:
    answer = ranker.ask("国庆旅游攻略", 110000, dt.date(2024, 11, 2))
    assert words(answer)[0] == "国庆旅游攻略"


def test_a_partial_query_is_ranked_by_region_and_season(ranker: Ranker) -> None:
    chengdu = ranker.ask("天气", 510000, dt.date(2025, 3, 11))
    assert words(chengdu)[0] == "成都天气预报" and "地域热点" in chengdu["hotwords"][0]["tags"]
    shanghai = ranker.ask("天气", 310000, dt.date(2025, 3, 11))
    assert words(shanghai)[0] == "上海天气预报" and "成都天气预报" not in words(shanghai)
    june = ranker.ask("高考", 0, dt.date(2025, 6, 22))
    assert set(words(june)[:3]) == {"高考成绩查询", "高考分数线", "高考志愿填报"}
    assert all("热门趋势" in h["tags"] for h in june["hotwords"][:3])
    december = ranker.ask("高考", 0, dt.date(2025, 12, 20))
    assert not any(h["tags"] for h in december["hotwords"])


def test_holiday_tags_follow_the_season(ranker: Ranker) -> None:
    golden = ranker.ask("旅游攻略", 0, dt.date(2025, 9, 28), top_k=10)
    march = ranker.ask("旅游攻略", 0, dt.date(2026, 3, 11), top_k=10)
    assert "国庆旅游攻略" in words(golden)[:3]
    tagged = {h["word"] for h in golden["hotwords"] if "节假日" in h["tags"]}
    assert "国庆旅游攻略" in tagged
    assert not any("节假日" in h["tags"] for h in march["hotwords"])
    assert (
        words(march).index("国庆旅游攻略") > words(golden).index("国庆旅游攻略")
        if "国庆旅游攻略" in words(march)
        else True
    )


@pytest.mark.parametrize(
    ("query", "region", "day"),
    [
        ("旅游攻略", 110000, dt.date(2025, 9, 28)),
        ("天气", 440000, dt.date(2025, 1, 20)),
        ("考研", 0, dt.date(2025, 3, 8)),
    ],
)
def test_a_tag_is_given_exactly_when_switching_its_feature_off_costs_the_score(
    ranker: Ranker, query: str, region: int, day: dt.date
) -> None:
    entries = load_corpus(ranker.version_dir / CORPUS)
    index = Index(entries, Segmenter(ranker.version_dir).search)
    featurizer = Featurizer(entries)
    matches = index.match(query, region)
    rows = featurizer.rows(matches, region, day).matrix[: len(matches.index)]
    full = ranker.score(rows)
    by_word = {entries[int(e)].word: i for i, e in enumerate(matches.index)}
    answer = ranker.ask(query, region, day, top_k=20)
    seen = 0
    for hotword in answer["hotwords"]:
        i = by_word[hotword["word"]]
        for tag, columns in ABLATIONS.items():
            off = rows[i : i + 1].copy()
            off[:, list(columns)] = 0.0
            drop = full[i] - ranker.score(off)[0]
            earned = drop >= TAG_DROP * full[i]
            assert (tag in hotword["tag_ids"]) == earned, (hotword, tag, drop)
            assert (TAG_LABELS[tag] in hotword["tags"]) == earned
            seen += earned
    assert seen > 0


def test_top_k_sets_the_answer_length_and_scores_fall_after_an_exact_match(ranker: Ranker) -> None:
    answer = ranker.ask("旅游攻略", 330000, DATES[1], top_k=12)
    scores = [h["score"] for h in answer["hotwords"]]
    assert len(scores) == 12 and scores[1:] == sorted(scores[1:], reverse=True)
    assert len(ranker.ask("旅游攻略", 330000, DATES[1], top_k=1)["hotwords"]) == 1


def test_the_corpus_is_read_from_the_version_folder_so_a_reload_picks_up_a_new_one(
    ranker: Ranker, tmp_path: Path
) -> None:
    copy = tmp_path / "1"
    shutil.copytree(ranker.version_dir, copy)
    with (copy / CORPUS).open("a", encoding="utf-8") as corpus:
        corpus.write("火星移民报名\t火星 移民 报名\t科技\t0\t\t1.00\n")
    assert ranker.ask("火星移民", 0, DATES[0])["matched"] is False
    reloaded = Ranker(copy)
    assert words(reloaded.ask("火星移民", 0, DATES[0])) == ["火星移民报名"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("词\t词\t类\tx\t\t1.0", "region must be an integer"),
        ("词\t词\t类\t0\tholiday:mars\t1.0", "season"),
        ("词\t词\t类\t0\t\t-1", "positive base"),
        ("词\t词", "6 tab-separated fields"),
    ],
)
def test_a_malformed_corpus_names_the_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / CORPUS
    path.write_text("word\tterms\tcategory\tregion\tseason\tbase\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"{CORPUS}:2: .*{message}"):
        load_corpus(path)


def test_the_shipped_corpus_is_what_the_generator_script_writes() -> None:
    spec = importlib.util.spec_from_file_location(
        "gen_corpus", REPO_ROOT / "scripts" / "gen_hotword_corpus.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shipped = (REPO_ROOT / "src" / "ortserve" / "apps" / "hotword" / "data" / CORPUS).read_text(
        encoding="utf-8"
    )
    assert module.corpus_text() == shipped
    entries = load_corpus(REPO_ROOT / "src" / "ortserve" / "apps" / "hotword" / "data" / CORPUS)
    assert len(entries) > 2000
    assert {e.region for e in entries} >= {0, *PROVINCES}
    assert {e.season[0] for e in entries if e.season} == {"holiday", "event"}


def test_scores_are_calibrated_on_a_held_out_log(ranker: Ranker) -> None:
    entries = load_corpus(ranker.version_dir / CORPUS)
    index = Index(entries, Segmenter(ranker.version_dir).search)
    x, clicked = examples(generate_log(entries, 500, seed=2024), index, Featurizer(entries), seed=1)
    predicted = ranker.score(x)
    bins = np.minimum((predicted * 10).astype(int), 9)
    gaps = [
        abs(predicted[bins == b].mean() - clicked[bins == b, 0].mean()) * (bins == b).sum()
        for b in range(10)
        if (bins == b).any()
    ]
    assert sum(gaps) / len(predicted) < 0.03


def test_the_log_and_the_training_are_deterministic_for_a_seed(ranker: Ranker) -> None:
    entries = load_corpus(ranker.version_dir / CORPUS)
    assert generate_log(entries, 100, seed=5) == generate_log(entries, 100, seed=5)
    assert generate_log(entries, 100, seed=5) != generate_log(entries, 100, seed=6)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 6)).astype(np.float32)
    y = (x[:, :1] > 0).astype(np.float32)
    first, second = train_mlp(x, y, 8, 3, seed=1), train_mlp(x, y, 8, 3, seed=1)
    assert np.array_equal(first.w1, second.w1) and np.array_equal(first.w2, second.w2)


@pytest.mark.parametrize(
    "query", ["國慶旅遊攻略", "guoqinglvyougonglue", "GuoQing LvYou GongLue", "guoqinglüyougonglue"]
)
def test_traditional_script_and_pinyin_find_the_simplified_hotword(ranker: Ranker, query: str) -> None:
    answer = ranker.ask(query, 110000, dt.date(2026, 9, 20))
    assert words(answer)[0] == "国庆旅游攻略"


def test_a_latin_query_that_is_no_pinyin_of_the_corpus_is_left_as_typed(ranker: Ranker) -> None:
    index = ranker.pipeline._index
    assert index.read("qwertyzx") == "qwertyzx" and index.read("tianqi") == "天气"


def test_no_answer_is_padded_with_noise_under_the_score_floor(ranker: Ranker) -> None:
    for query, day in (("世界杯", dt.date(2026, 6, 10)), ("国庆旅游攻略", dt.date(2026, 9, 20))):
        answer = ranker.ask(query, 110000, day)
        assert answer["matched"] and all(h["score"] >= MIN_SCORE for h in answer["hotwords"][1:])
        assert not any("冰雪大世界" in w or w.startswith(("大庆", "安庆")) for w in words(answer))


@pytest.mark.parametrize(
    ("query", "day", "expected"),
    [
        ("春运火车票", dt.date(2026, 1, 25), "春运抢票"),  # 23 days before 春节: 春运 ticket sales
        ("春运", dt.date(2026, 2, 10), "春运抢票"),  # inside the 40-day season
        ("国庆", dt.date(2026, 9, 28), "国庆天气"),  # 3 days before
        ("端午", dt.date(2026, 6, 8), "端午天气"),  # 11 days before
    ],
)
def test_a_season_in_its_window_earns_the_holiday_tag(
    ranker: Ranker, query: str, day: dt.date, expected: str
) -> None:
    answer = ranker.ask(query, 110000, day)
    found = {h["word"]: h for h in answer["hotwords"]}
    assert expected in found and "节假日" in found[expected]["tags"]
    assert all("节假日" not in h["tags"] for h in ranker.ask(query, 110000, dt.date(2026, 7, 20))["hotwords"])


@pytest.mark.parametrize(
    ("query", "region", "first"),
    [
        ("天气", 440300, "深圳天气预报"),  # a city code: its own city first, not the capital
        ("天气", 440305, "深圳天气预报"),  # a district code is read as its city
        ("房价", 440100, "广州房价走势"),
        ("天气", 510000, "成都天气预报"),  # a province code: the province's cities, capital first
    ],
)
def test_regions_are_city_level_with_the_province_behind(
    ranker: Ranker, query: str, region: int, first: str
) -> None:
    answer = ranker.ask(query, region, dt.date(2026, 3, 11))
    scores = [h["score"] for h in answer["hotwords"]]
    assert words(answer)[0] == first and scores[0] > scores[1]


def test_locality_is_home_nearby_or_elsewhere() -> None:
    regions = np.array([440300, 440100, 440000, 110000, 0])
    assert locality(regions, 440305).tolist() == [1.0, NEARBY, 1.0, 0.0, 0.0]
    assert locality(regions, 440000).tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert locality(regions, 0).tolist() == [0.0] * 5


@pytest.mark.parametrize(
    ("query", "first"), [("兰州地铁多少钱", "兰州地铁线路"), ("长春攻略多少钱", "长春旅游攻略")]
)
def test_the_score_floor_trims_padding_but_never_the_best_answer(
    ranker: Ranker, query: str, first: str
) -> None:
    answer = ranker.ask(query, 110000, dt.date(2026, 3, 11))
    assert answer["matched"] is True and words(answer)[0] == first
