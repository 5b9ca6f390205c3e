"""Training a hotword version from a search log: a new word that spikes is suggested first."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from ortserve.apps.hotword.holidays import CHINA
from ortserve.apps.hotword.log_training import example_log, read_log
from ortserve.apps.hotword.pipeline import HotwordPipeline
from ortserve.apps.hotword.training import OUTPUT
from ortserve.cli.main import main
from ortserve.errors import ConfigError
from ortserve.pipeline.contract import JsonObject, PipelineContext

LAUNCH = dt.datetime(2026, 9, 10, 12, tzinfo=CHINA)


def _ms(moment: dt.datetime) -> int:
    return int(moment.timestamp() * 1000)


def _ask(version_dir: Path, query: str, moment: dt.datetime) -> JsonObject:
    pipeline = HotwordPipeline(PipelineContext("hotword", "2", version_dir))
    session = ort.InferenceSession(str(version_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    prepared = pipeline.parse({"query": query, "region_id": 110000, "timestamp": _ms(moment)})
    calls = pipeline.preprocess(prepared)
    outputs = [{OUTPUT: np.asarray(session.run(None, dict(call.inputs))[0])} for call in calls]
    return pipeline.postprocess(outputs, prepared)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hotword-log")
    log = folder / "clicks.jsonl"
    lines = list(example_log(600, seed=3))
    rng = np.random.default_rng(0)
    for i in range(300):  # the launch week: 300 searches for the new phone
        moment = LAUNCH - dt.timedelta(hours=float(rng.uniform(0, 24 * 6)))
        query = ["iphone 17", "iphone17", "苹果17"][i % 3]
        lines.append(
            json.dumps(
                {"query": query, "clicked": "iphone17发布会", "timestamp": _ms(moment), "region_id": 0}
            )
        )
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = folder / "hotword" / "2"
    result = CliRunner().invoke(
        main,
        ["hotword", "train", "--log", str(log), "--out", str(out), "--generated", "1500", "--epochs", "6"],
    )
    assert result.exit_code == 0, result.output
    assert "900 searches; 1 new hotwords" in result.output
    return out


def test_a_new_word_spiking_in_the_log_is_suggested_first_for_its_query(trained: Path) -> None:
    answer = _ask(trained, "iphone 17", LAUNCH)
    hotwords = answer["hotwords"]
    assert isinstance(hotwords, list) and hotwords[0]["word"] == "iphone17发布会"
    assert (trained / "ortserve.complete").exists()


def test_the_trained_version_still_knows_the_seed_corpus(trained: Path) -> None:
    answer = _ask(trained, "国庆旅游攻略", LAUNCH)
    hotwords = answer["hotwords"]
    assert isinstance(hotwords, list) and hotwords[0]["word"] == "国庆旅游攻略"


def test_a_malformed_log_is_refused_naming_the_line(tmp_path: Path) -> None:
    log = tmp_path / "bad.jsonl"
    log.write_text(
        '{"query": "天气", "clicked": "天气预报", "timestamp": 1759017600000}\n{"query": 5}\n', "utf-8"
    )
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: 'query'"):
        read_log(log)
    result = CliRunner().invoke(main, ["hotword", "train", "--log", str(log), "--out", str(tmp_path / "v")])
    assert result.exit_code != 0 and "bad.jsonl:2" in result.output
