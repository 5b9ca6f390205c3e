"""TensorRT INT8 calibration tables, written beside a repository version's model.

TensorRT runs a float graph in INT8 when it is given each tensor's dynamic range. ONNX Runtime's
calibrators (``create_calibrator``, min-max over real inputs) collect those ranges and
``write_calibration_table`` writes them in the forms ONNX Runtime's TensorRT provider reads:
``calibration.flatbuffers`` (the one used: ``trt_int8_use_native_calibration_table=False``),
``calibration.cache`` (TensorRT's text form) and ``calibration.json``.

``ortserve quantize --model M --trt-int8-calibration DATA`` writes them into the version folder;
when a TensorRT session of that version is built (core/session.py -> core/tensorrt.py), the
table is copied into the engine cache folder (keyed by the table's digest too: a new table is
a new engine) and ``trt_int8_enable`` / ``trt_int8_calibration_table_name`` are set, unless the
model's own provider options say otherwise.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import onnxruntime as ort

from ortserve.errors import InvalidInput
from ortserve.quantization.calibration import Feeds, captured_feeds, npz_feeds

__all__ = ["TABLE_FILES", "TABLE_NAME", "calibrate_tensorrt_int8", "write_version_calibration"]

TABLE_NAME = "calibration.flatbuffers"
"""The table ONNX Runtime's TensorRT provider is pointed at."""
TABLE_FILES = (TABLE_NAME, "calibration.cache", "calibration.json")


class _Reader:
    """ONNX Runtime's CalibrationDataReader protocol: ``get_next`` until None."""

    def __init__(self, feeds: Sequence[Feeds]) -> None:
        self._feeds: Iterator[Feeds] = iter(feeds)

    def get_next(self) -> Feeds | None:
        return next(self._feeds, None)


def calibrate_tensorrt_int8(model: Path, feeds: Sequence[Feeds], folder: Path) -> Path:
    """Collect min-max ranges of every tensor of ``model`` over ``feeds`` (on the CPU) and write
    the calibration table files into ``folder``; the path of the flatbuffers table.

    Raises:
        InvalidInput: no feeds.
    """
    from onnxruntime.quantization import CalibrationMethod, create_calibrator, write_calibration_table

    if not feeds:
        raise InvalidInput("TensorRT INT8 calibration needs at least one input")
    with tempfile.TemporaryDirectory(prefix="ortserve-trt-int8-") as scratch:
        calibrator = create_calibrator(
            model,
            [],  # every tensor: TensorRT wants a range for each
            augmented_model_path=str(Path(scratch) / "augmented.onnx"),
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"symmetric": True},
        )
        calibrator.set_execution_providers(["CPUExecutionProvider"])
        calibrator.collect_data(_Reader(feeds))
        ranges = calibrator.compute_data()
        write_calibration_table(ranges.data, dir=scratch)
        folder.mkdir(parents=True, exist_ok=True)
        for name in TABLE_FILES:
            shutil.move(str(Path(scratch) / name), folder / name)
    return folder / TABLE_NAME


def write_version_calibration(
    repository: Path, model: str, source: int | None, data: Path, samples: int
) -> Path:
    """The table for one repository version (default: the highest), from real inputs: a capture
    directory of the server's traffic or an ``.npz`` keyed by input name; its path.

    Raises:
        InvalidInput: no such model or version, unusable calibration data.
    """
    from ortserve.repository.config_source import read_model_config

    folder = repository / model
    versions = (
        sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())
        if folder.is_dir()
        else []
    )
    if not versions:
        raise InvalidInput(f"{folder}: no model folder with numbered versions")
    version = source if source is not None else versions[-1]
    if version not in versions:
        raise InvalidInput(f"{folder}: no version {version} (versions: {versions})")
    config = read_model_config(folder)
    version_dir = folder / str(version)
    path = version_dir / config.default_model_filename
    inputs = [
        arg.name for arg in ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).get_inputs()
    ]
    if data.suffix == ".npz":
        feeds = npz_feeds(data, inputs, samples)
    elif data.is_dir():
        feeds = captured_feeds(data, model, version_dir, config.pipeline, samples)
    else:
        raise InvalidInput(f"--trt-int8-calibration {data}: neither a capture directory nor an .npz file")
    return calibrate_tensorrt_int8(path, feeds, version_dir)
