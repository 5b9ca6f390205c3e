"""Loading a version folder into a served version: a BF16 graph warms up, advertises and batches."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fake_executor import BatchRecorder
from model_builders import bf16_model, serialized
from ortserve.config.model import load_model_config
from ortserve.core.datatypes import bf16_from_float32, bf16_to_float32
from ortserve.core.job import BatchJob, RunResult
from ortserve.core.types import InferInput, InferRequest, TensorSpec
from ortserve.errors import ConfigError
from ortserve.repository.loader import load_version
from ortserve.settings import ServerSettings


def _wait(gate: threading.Event) -> Callable[[RunResult | None, BaseException | None, bool], None]:
    def complete(result: RunResult | None, error: BaseException | None, chain: bool) -> None:
        gate.wait(10)

    return complete


def bf16_request(values: list[list[float]]) -> InferRequest:
    bits = bf16_from_float32(np.array(values, dtype=np.float32))
    return InferRequest("bf16", [InferInput("x", "BF16", bits.shape, bits)])


async def test_bf16_requests_batched_together_each_get_their_own_rows_as_bf16(tmp_path: Path) -> None:
    folder = tmp_path / "bf16" / "1"
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(serialized(bf16_model()))
    (tmp_path / "bf16" / "config.yaml").write_text(
        "batching:\n  max_batch_size: 8\n  max_queue_delay_ms: 5000\n"
    )
    recorder = BatchRecorder()
    settings = ServerSettings(model_repository=tmp_path, intra_op_threads=1)
    served = await load_version(
        "bf16", 1, folder / "model.onnx", load_model_config(tmp_path / "bf16"), settings, recorder
    )
    try:
        assert served.info.inputs == (TensorSpec("x", "BF16", (-1, 4)),)
        assert [(s.name, s.datatype) for s in served.info.outputs] == [("y", "BF16"), ("y_f32", "FP32")]
        rows: list[list[list[float]]] = [
            [[1.0, 2.0, 3.0, 4.0]],
            [[0.1, -0.5, 1e30, float("nan")], [5, 6, 7, 8]],
            [[-1, -2, -3, -4]],
        ]
        # The three requests arrive in one loop tick, so they go as one batch. A job the
        # scheduler does not know of holds the worker meanwhile, so the batch waits in the
        # worker's queue rather than racing the test.
        assert served.runner is not None
        served.runner.inline_below_s = 0.0  # decided by warm-up timings otherwise
        gate = threading.Event()
        hold = BatchJob(
            {"x": bf16_from_float32(np.zeros((1, 4), dtype=np.float32))}, math.inf, False, _wait(gate)
        )
        served.runner.execute(hold)
        answers = [served.submit(bf16_request(values)) for values in rows]
        gate.set()
        responses = await asyncio.gather(*answers)
    finally:
        await served.unload(5.0)
    assert [record.requests for record in recorder.records] == [3]
    for values, response in zip(rows, responses):
        doubled = bf16_to_float32(bf16_from_float32(np.array(values, dtype=np.float32))) * 2
        y, y_f32 = response.outputs
        assert (y.name, y.datatype, y.shape) == ("y", "BF16", doubled.shape) and y.data.dtype == np.uint16
        np.testing.assert_array_equal(y.data, bf16_from_float32(doubled))
        assert y_f32.datatype == "FP32" and y_f32.data.dtype == np.float32
        np.testing.assert_array_equal(y_f32.data, doubled)


async def test_a_huge_max_batch_size_warms_up_within_a_bounded_size(tmp_path: Path, monkeypatch: Any) -> None:
    """max_batch_size 1,000,000 on a 64-float input: the default warm-up's large batch is the
    most rows within 64 MiB (131,072), not a million (a config in a load request made 4.8 GB
    of warm-up feeds at two million); serving still accepts any batch up to the maximum."""
    from ortserve.demo import build_mlp
    from ortserve.repository import loader

    folder = tmp_path / "m" / "1"
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(build_mlp([64, 8, 2], 0, "m").SerializeToString())
    (tmp_path / "m" / "config.yaml").write_text("batching:\n  max_batch_size: 1000000\n")
    rows: list[int] = []
    made = loader._warmup_feeds

    def counted(specs: Any, count: int, rng: Any) -> Any:
        rows.append(count)
        return made(specs, count, rng)

    monkeypatch.setattr(loader, "_warmup_feeds", counted)
    settings = ServerSettings(model_repository=tmp_path, intra_op_threads=1)
    served = await load_version(
        "m", 1, folder / "model.onnx", load_model_config(tmp_path / "m"), settings, BatchRecorder()
    )
    try:
        assert served.info.max_batch_size == 1_000_000
        assert max(rows) == (64 << 20) // (64 * 8)
    finally:
        await served.unload(1.0)


@pytest.mark.parametrize(
    "text",
    [
        "batching:\n  max_batch_size: 2000000\n",
        "intra_op_threads: 3000\n",
        "inter_op_threads: 3000\n",
    ],
)
def test_batch_sizes_and_thread_counts_are_bounded(tmp_path: Path, text: str) -> None:
    """Each would be allocated as declared: warm-up rows, or OS threads."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.yaml").write_text(text)
    with pytest.raises(ConfigError, match="less than or equal"):
        load_model_config(tmp_path / "m")
