"""TensorRT INT8 on the CPU: the calibration table is written beside a version's model by
``ortserve quantize --trt-int8-calibration``, and TensorRT's options use it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
from click.testing import CliRunner

from ortserve.cli.main import main
from ortserve.core.tensorrt import InputShape, int8_table, tensorrt_options
from ortserve.quantization.tensorrt_int8 import TABLE_FILES, TABLE_NAME


def _table(demo_repository: Path, tmp_path: Path) -> tuple[Path, npt.NDArray[np.float32]]:
    root = tmp_path / "models"
    shutil.copytree(demo_repository / "small_mlp", root / "small_mlp")
    inputs = np.random.default_rng(1).standard_normal((32, 64)).astype(np.float32)
    np.savez(tmp_path / "calibration.npz", input=inputs)
    result = CliRunner().invoke(
        main,
        [
            "quantize",
            "--model-repository",
            str(root),
            "--model",
            "small_mlp",
            "--trt-int8-calibration",
            str(tmp_path / "calibration.npz"),
            "--samples",
            "16",
        ],
    )
    assert result.exit_code == 0, result.output
    return root / "small_mlp" / "1", inputs


def test_the_cli_writes_the_calibration_table_beside_the_model(demo_repository: Path, tmp_path: Path) -> None:
    version, inputs = _table(demo_repository, tmp_path)
    assert all((version / name).is_file() for name in TABLE_FILES)
    assert sorted(p.name for p in version.parent.iterdir() if p.is_dir()) == ["1"]  # no new version
    graph = onnx.load(str(version / "model.onnx"))
    ranges = dict(line.rsplit(" ", 1) for line in (version / "calibration.cache").read_text().splitlines())
    # a range for the input and every node output, each the largest magnitude seen
    tensors = {"input"} | {out for node in graph.graph.node for out in node.output}
    assert tensors <= set(ranges)
    assert float(ranges["input"]) == np.abs(inputs[:16]).max()
    assert json.loads((version / "calibration.json").read_text())
    assert (version / TABLE_NAME).stat().st_size > 0
    assert int8_table(version) == version / TABLE_NAME


def test_tensorrt_options_run_int8_with_the_table_copied_into_a_cache_keyed_by_it(tmp_path: Path) -> None:
    table = tmp_path / "model" / TABLE_NAME
    table.parent.mkdir()
    table.write_bytes(b"table one")
    inputs = [InputShape("input", (None, 64))]
    cache = tmp_path / "cache" / "gpu-trt10" / "digest"
    options = tensorrt_options({}, inputs, 8, [], cache, table)
    folder = Path(options["trt_engine_cache_path"])
    assert options["trt_int8_enable"] == "True"
    assert options["trt_int8_calibration_table_name"] == TABLE_NAME
    assert options["trt_int8_use_native_calibration_table"] == "False"
    assert folder.parent == cache and folder.name.startswith("int8-")
    assert (folder / TABLE_NAME).read_bytes() == b"table one"
    table.write_bytes(b"table two")
    assert tensorrt_options({}, inputs, 8, [], cache, table)["trt_engine_cache_path"] != str(folder)
    refused = tensorrt_options({"trt_int8_enable": "False"}, inputs, 8, [], cache, table)
    assert refused["trt_int8_enable"] == "False" and "trt_int8_calibration_table_name" not in refused
    plain = tensorrt_options({}, inputs, 8, [], cache, None)
    assert "trt_int8_enable" not in plain and plain["trt_engine_cache_path"] == str(cache)
    assert int8_table(tmp_path) is None
