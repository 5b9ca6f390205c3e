"""``ortserve quantize`` as a library: from a repository version, write one new version per
method (the other files of the source folder copied beside it) and measure every variant."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from ortserve.errors import InvalidInput
from ortserve.quantization.calibration import Feeds, captured_feeds, generated_feeds, npz_feeds
from ortserve.quantization.convert import Method, convert
from ortserve.quantization.report import (
    Measurement,
    Outputs,
    compare_models,
    latency_ms,
    run_all,
    session,
    size_bytes,
)
from ortserve.repository.config_source import read_model_config

__all__ = ["QuantizeJob", "quantize"]


@dataclass(frozen=True, slots=True)
class QuantizeJob:
    """What to quantize and how.

    Args:
        repository: the model repository; model: the model folder's name.
        source: the version to start from (None: the highest).
        methods: one new version per method, numbered after the highest existing version.
        calibration: a capture directory or an ``.npz`` of inputs (None: random inputs,
            float models only, and no static INT8).
        samples: most calibration requests used.
        threads: intra-op threads for the latency figures.
    """

    repository: Path
    model: str
    methods: tuple[Method, ...]
    source: int | None = None
    calibration: Path | None = None
    samples: int = 256
    threads: int = 1


def quantize(job: QuantizeJob) -> list[Measurement]:
    """Write the new versions and return the table's rows (the source first).

    Raises:
        InvalidInput: no such model or version, unusable calibration input.
        ConfigError: the model's config.yaml is invalid.
    """
    if Method.STATIC_INT8 in job.methods and job.calibration is None:
        raise InvalidInput("static INT8 needs real calibration inputs: --calibration DIR|FILE.npz")
    folder = job.repository / job.model
    versions = (
        sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())
        if folder.is_dir()
        else []
    )
    if not versions:
        raise InvalidInput(f"{folder}: no model folder with numbered versions")
    source = job.source if job.source is not None else versions[-1]
    if source not in versions:
        raise InvalidInput(f"{folder}: no version {source} (versions: {versions})")
    config = read_model_config(folder)
    filename = config.default_model_filename
    source_dir = folder / str(source)
    reference = session(source_dir / filename, job.threads)
    feeds = _feeds(job, source_dir, config.pipeline, reference)
    expected = run_all(reference, feeds)
    rows = [_measure("fp32 (source)", str(source), source_dir, filename, job.threads, feeds, None)]
    number = versions[-1]
    for method in job.methods:
        number += 1
        target = folder / str(number)
        _copy_artefacts(source_dir, target, filename)
        convert(source_dir / filename, target / filename, method, feeds)
        row = _measure(method.value, str(number), target, filename, job.threads, feeds, expected)
        (target / "quantization.json").write_text(
            json.dumps({"method": method.value, "source_version": source, **row.as_dict()}, indent=2),
            encoding="utf-8",
        )
        rows.append(row)
    return rows


def _feeds(
    job: QuantizeJob, source_dir: Path, pipeline: str | None, reference: ort.InferenceSession
) -> list[Feeds]:
    inputs = [spec.name for spec in reference.get_inputs()]
    if job.calibration is None:
        return generated_feeds(reference, min(job.samples, 64), rows=8)
    if job.calibration.suffix == ".npz":
        return npz_feeds(job.calibration, inputs, job.samples)
    if job.calibration.is_dir():
        return captured_feeds(job.calibration, job.model, source_dir, pipeline, job.samples)
    raise InvalidInput(f"--calibration {job.calibration}: neither a capture directory nor an .npz file")


def _copy_artefacts(source: Path, target: Path, filename: str) -> None:
    """Everything of the source version but its model (and signature): a pipeline's files too."""
    target.mkdir(parents=True, exist_ok=False)
    for path in source.iterdir():
        if (
            path.is_file()
            and path.name != filename
            and path.suffix not in (".data", ".sig")
            and path.name != "quantization.json"
        ):
            shutil.copy2(path, target / path.name)


def _measure(
    variant: str,
    version: str,
    folder: Path,
    filename: str,
    threads: int,
    feeds: Sequence[Feeds],
    expected: Outputs | None,
) -> Measurement:
    sess = session(folder / filename, threads)
    b1, b32 = latency_ms(sess, feeds[0], 1), latency_ms(sess, feeds[0], 32)
    size = size_bytes(folder, filename)
    if expected is None:
        return Measurement(variant, version, size, b1, b32)
    max_abs, p99, top1, topk = compare_models(expected, run_all(sess, feeds))
    return Measurement(variant, version, size, b1, b32, max_abs, p99, top1, topk, len(feeds))
