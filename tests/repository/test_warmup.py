"""A model's own warm-up samples (model_warmup): run before it serves, checked against the graph."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import numpy as np
import pytest

from model_builders import serialized, typed_model, write_scaled_version
from ortserve.config.model import load_model_config
from ortserve.core.types import TensorSpec
from ortserve.errors import ConfigError
from ortserve.repository.loader import load_version
from ortserve.repository.warmup import WarmupSample, sample_feeds
from ortserve.settings import ServerSettings

X = (TensorSpec("x", "FP32", (-1, 4)),)


def sample(**given: object) -> WarmupSample:
    inputs = {"x": {"datatype": "FP32", "dims": [4], "data": "zero"} | given}
    return WarmupSample.model_validate({"name": "w", "batch_size": 3, "inputs": inputs})


def test_zero_random_and_file_samples_become_feeds_of_the_batch_size(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "x.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    zeros = sample_feeds(sample(), X, 8, tmp_path)["x"]
    noise = sample_feeds(sample(data="random"), X, 8, tmp_path)["x"]
    rows = sample_feeds(sample(data="file", file="x.bin"), X, 8, tmp_path)["x"]
    assert zeros.shape == noise.shape == rows.shape == (3, 4)
    assert not zeros.any() and noise.std() > 0
    assert rows.tolist() == [[0.0, 1.0, 2.0, 3.0]] * 3  # one row from the file, repeated


@pytest.mark.parametrize(
    ("given", "batching", "message"),
    [
        ({"datatype": "INT64"}, 8, "datatype INT64 but the graph takes FP32"),
        ({"dims": [5]}, 8, r"shape \[3, 5\] does not fit the graph's \[-1, 4\]"),
        ({}, 2, "batch_size 3 is not within 1..max_batch_size 2"),
        ({"data": "file", "file": "absent.bin"}, 8, "cannot read"),
        ({"data": "file", "file": "short.bin"}, 8, "has 8 bytes, one row of FP32 is 16"),
        ({"dims": [1 << 30]}, 8, "more than a warm-up takes"),
    ],
)
def test_a_sample_that_does_not_fit_is_refused_naming_it(
    tmp_path: Path, given: dict[str, object], batching: int, message: str
) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "short.bin").write_bytes(bytes(8))
    spec = (TensorSpec("x", "FP32", (-1, -1)),) if given.get("dims") == [1 << 30] else X
    with pytest.raises(ConfigError, match=message):
        sample_feeds(sample(**given), spec, batching, tmp_path)


def test_every_graph_input_is_needed_and_no_other() -> None:
    two = (*X, TensorSpec("z", "FP32", (-1, 4)))
    with pytest.raises(ConfigError, match=r"inputs not in the graph \[\], graph inputs not given \['z'\]"):
        sample_feeds(sample(), two, 8, Path("."))


def test_strings_come_from_a_file_as_length_prefixed_elements(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "t.bin").write_bytes(b"".join(struct.pack("<I", len(s)) + s for s in (b"ab", b"")))
    text = WarmupSample.model_validate(
        {"name": "t", "inputs": {"text": {"datatype": "BYTES", "dims": [2], "data": "file", "file": "t.bin"}}}
    )
    assert sample_feeds(text, (TensorSpec("text", "BYTES", (2,)),), 0, tmp_path)["text"].tolist() == [
        b"ab",
        b"",
    ]
    (tmp_path / "warmup" / "t.bin").write_bytes(struct.pack("<I", 9) + b"ab")
    with pytest.raises(ConfigError, match="is not 2 length-prefixed strings"):
        sample_feeds(text, (TensorSpec("text", "BYTES", (2,)),), 0, tmp_path)


async def test_the_samples_run_before_the_version_serves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = write_scaled_version(tmp_path, "m", 1, 2.0)
    (tmp_path / "m" / "warmup").mkdir()
    (tmp_path / "m" / "warmup" / "x.bin").write_bytes(np.ones(4, dtype=np.float32).tobytes())
    (tmp_path / "m" / "config.yaml").write_text(
        "warmup:\n  - name: real\n    batch_size: 2\n    count: 4\n"
        "    inputs: {x: {datatype: FP32, dims: [4], data: file, file: x.bin}}\n"
    )
    settings = ServerSettings(model_repository=tmp_path, intra_op_threads=1)
    with caplog.at_level(logging.INFO, logger="ortserve.repository.loader"):
        served = await load_version(
            "m", 1, folder / "model.onnx", load_model_config(tmp_path / "m"), settings
        )
    await served.unload(1.0)
    assert any("warm-up sample 'real': 4 runs" in r.getMessage() for r in caplog.records)


async def test_a_sample_the_graph_fails_on_fails_the_load(tmp_path: Path) -> None:
    folder = tmp_path / "typed" / "1"
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(serialized(typed_model()))
    inputs = {
        "i64": {"datatype": "INT64", "dims": [2, 3]},
        "flag": {"datatype": "BOOL", "dims": [2]},
        "half": {"datatype": "FP16", "dims": [4]},
        "text": {"datatype": "BYTES", "dims": [2]},
    }
    config = load_model_config(tmp_path / "typed").model_copy(
        update={"warmup": [WarmupSample.model_validate({"name": "ok", "batch_size": 1, "inputs": inputs})]}
    )
    settings = ServerSettings(model_repository=tmp_path, intra_op_threads=1)
    served = await load_version("typed", 1, folder / "model.onnx", config, settings)
    await served.unload(1.0)
    wrong = {**inputs, "half": {"datatype": "FP16", "dims": [5]}}
    bad = config.model_copy(
        update={"warmup": [WarmupSample.model_validate({"name": "bad", "batch_size": 1, "inputs": wrong})]}
    )
    with pytest.raises(ConfigError, match="model_warmup 'bad'"):
        await load_version("typed", 1, folder / "model.onnx", bad, settings)
