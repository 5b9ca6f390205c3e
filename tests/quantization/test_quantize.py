"""``ortserve quantize``: FP16, dynamic and static INT8 versions that the server loads, with
their divergence reported; static INT8 calibrated from an .npz, from captured OIP requests, and
from captured pipeline requests run through the pipeline's preprocessing."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
from click.testing import CliRunner

from ortserve.capture import Capture
from ortserve.cli.main import main
from ortserve.core.types import InferInput, InferRequest
from ortserve.errors import InvalidInput
from ortserve.quantization.convert import Method
from ortserve.quantization.quantizer import QuantizeJob, quantize
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.registry import ModelRegistry
from ortserve.settings import ServerSettings

NOW = 1_759_017_600_000


@pytest.fixture
def repository(demo_repository: Path, tmp_path: Path) -> Path:
    root = tmp_path / "models"
    for model in ("small_mlp", "hotword"):
        shutil.copytree(demo_repository / model, root / model)
    for model in ("small_mlp", "hotword"):
        with (root / model / "config.yaml").open("a", encoding="utf-8") as config:
            config.write("\nversion_policy: all\n")
    return root


async def capture(directory: Path, records: list[tuple[str, str, bytes]]) -> None:
    writer = Capture(directory, rate=1.0)
    await writer.start()
    for path, model, body in records:
        writer.offer_http(path, model, None, {}, body, (time.time(), time.monotonic()), 200)
    await writer.stop()


def test_the_cli_writes_fp16_and_dynamic_int8_versions_and_prints_the_table(repository: Path) -> None:
    result = CliRunner().invoke(
        main,
        [
            "quantize",
            "--model-repository",
            str(repository),
            "--model",
            "small_mlp",
            "--method",
            "fp16",
            "--method",
            "dynamic-int8",
        ],
    )
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith(("fp32", "fp16", "dynamic"))]
    assert [line.split()[0] for line in lines] == ["fp32", "fp16", "dynamic-int8"]
    assert sorted(p.name for p in (repository / "small_mlp").iterdir() if p.is_dir()) == ["1", "2", "3"]
    report = json.loads((repository / "small_mlp" / "3" / "quantization.json").read_text())
    assert report["method"] == "dynamic-int8" and report["source_version"] == 1
    assert 0 < report["max_abs"] < 1 and report["size_bytes"] < report["pairs"] * 10**9


async def test_static_int8_from_an_npz_loads_and_serves_close_to_the_source(
    repository: Path, tmp_path: Path
) -> None:
    inputs = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    np.savez(tmp_path / "calibration.npz", input=inputs)
    rows = quantize(
        QuantizeJob(
            repository,
            "small_mlp",
            (Method.STATIC_INT8, Method.FP16),
            calibration=tmp_path / "calibration.npz",
        )
    )
    assert [(r.variant, r.version, r.pairs) for r in rows] == [
        ("fp32 (source)", "1", 0),
        ("static-int8", "2", 64),
        ("fp16", "3", 64),
    ]
    assert (
        rows[1].size_bytes < rows[0].size_bytes / 2 and rows[1].max_abs is not None and rows[1].max_abs < 1.0
    )
    registry = ModelRegistry()
    await LifecycleManager(registry, ServerSettings(model_repository=repository, intra_op_threads=1)).start(
        ["small_mlp"]
    )
    try:
        answers: dict[str, np.ndarray] = {}
        for version in ("1", "2", "3"):
            request = InferRequest("small_mlp", [InferInput("input", "FP32", (1, 64), inputs[:1])])
            answer = await registry.resolve("small_mlp", version).infer(request)
            answers[version] = np.asarray(answer.outputs[0].data, dtype=np.float32)
        assert np.allclose(answers["3"], answers["1"], atol=0.05)
        assert np.abs(answers["2"] - answers["1"]).max() <= rows[1].max_abs + 1e-6
    finally:
        await registry.unload_all(5.0)


async def test_static_int8_calibrates_from_captured_oip_and_pipeline_requests(
    repository: Path, tmp_path: Path
) -> None:
    x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    oip = orjson.dumps(
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": [4, 64], "data": x.ravel().tolist()}]}
    )
    queries = ["天气", "旅游攻略", "北京美食", "国庆旅游"]
    await capture(
        tmp_path / "capture",
        [("/v2/models/small_mlp/infer", "small_mlp", oip)] * 8
        + [
            ("/v1/predict", "hotword.pipeline", orjson.dumps({"query": q, "timestamp": NOW})) for q in queries
        ],
    )
    mlp = quantize(
        QuantizeJob(repository, "small_mlp", (Method.STATIC_INT8,), calibration=tmp_path / "capture")
    )
    assert mlp[1].pairs == 8
    hotword = quantize(
        QuantizeJob(repository, "hotword", (Method.STATIC_INT8,), calibration=tmp_path / "capture")
    )
    assert hotword[1].pairs == len(queries) and hotword[1].top1 is not None
    assert (repository / "hotword" / "2" / "corpus.tsv").is_file()  # the pipeline's artefacts came along


def test_static_int8_without_real_inputs_is_refused(repository: Path) -> None:
    with pytest.raises(InvalidInput, match="calibration"):
        quantize(QuantizeJob(repository, "small_mlp", (Method.STATIC_INT8,)))
