"""A batch screened once: the requests breaking a limit are refused 400 each, the rest run."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from fake_executor import BatchRecorder, FakeExecutor
from model_builders import write_scaled_version
from ortserve.config.model import load_model_config
from ortserve.core.policy import SchedulingPolicy
from ortserve.core.sandbox import InputLimits, InputSandbox
from ortserve.core.scheduler import Scheduler
from ortserve.core.types import InferInput, InferRequest
from ortserve.errors import InvalidInput
from ortserve.repository.loader import load_version
from ortserve.settings import ServerSettings
from ortserve.testing import FakeClock

SANDBOX = "inputs:\n  x: {max: 100, allow_nan: false}\n"


def request(values: list[list[float]]) -> InferRequest:
    data = np.array(values, dtype=np.float32)
    return InferRequest("guarded", [InferInput("x", "FP32", data.shape, data)])


async def test_a_mixed_batch_refuses_each_offender_by_its_own_element_and_serves_the_rest(
    tmp_path: Path,
) -> None:
    write_scaled_version(tmp_path, "guarded", 1, 2.0)
    (tmp_path / "guarded" / "config.yaml").write_text("batching: {max_batch_size: 8}\n" + SANDBOX)
    recorder = BatchRecorder()
    settings = ServerSettings(model_repository=tmp_path, intra_op_threads=1)
    config = load_model_config(tmp_path / "guarded")
    served = await load_version(
        "guarded", 1, tmp_path / "guarded" / "1" / "model.onnx", config, settings, recorder
    )
    try:
        given: list[list[list[float]]] = [
            [[1, 2, 3, 4]],
            [[1, 2, 3, 4], [5, float("nan"), 7, 8]],  # its own row 1, not the batch's row 2
            [[5, 6, 7, 8], [9, 10, 11, 12]],
            [[1, 2, 3, 400]],
        ]
        # Submitted in one loop tick: one batch of all four.
        answers = await asyncio.gather(*(served.submit(request(v)) for v in given), return_exceptions=True)
        assert isinstance(answers[1], InvalidInput) and answers[1].http_status == 400
        assert answers[1].message == "input 'x': element [1, 1] is nan: NaN is not allowed"
        assert isinstance(answers[3], InvalidInput)
        assert answers[3].message == "input 'x': element [0, 3] is 400.0: above the maximum 100"
        for index in (0, 2):
            response = answers[index]
            assert not isinstance(response, BaseException)
            np.testing.assert_array_equal(response.outputs[0].data, np.array(given[index], np.float32) * 2)
        batch = recorder.records[-1]
        assert (batch.requests, batch.rows, len(batch.queue_waits_s), batch.failed) == (2, 3, 2, False)

        # A batch with nothing left to run: every request refused, no run recorded, and the
        # instance is free for the next request.
        runs = len(recorder.records)
        refused = await asyncio.gather(
            *(served.submit(request([[float("nan"), 0, 0, 0]])) for _ in range(3)), return_exceptions=True
        )
        assert all(isinstance(r, InvalidInput) for r in refused)
        assert len(recorder.records) == runs
        after = await served.submit(request([[1, 1, 1, 1]]))
        np.testing.assert_array_equal(after.outputs[0].data, [[2, 2, 2, 2]])
        assert served.scheduler.busy_instances == 0
    finally:
        await served.unload(1.0)


def one_row(value: float) -> dict[str, np.ndarray]:
    return {"x": np.full((1, 4), value, dtype=np.float32)}


@pytest.mark.parametrize("bad", [[2, 5], list(range(8))])
async def test_a_batch_a_worker_takes_itself_is_screened_too(bad: list[int]) -> None:
    # A worker that finishes a batch while a full one waits takes it without the loop; the
    # screen runs there as well.
    loop = asyncio.get_running_loop()
    executor = FakeExecutor()
    sandbox = InputSandbox({"x": InputLimits(max=100)})
    scheduler = Scheduler(executor, SchedulingPolicy(max_batch_size=8), FakeClock(), loop, screen=sandbox)
    first = scheduler.submit(one_row(1.0), 1)
    await asyncio.sleep(0)
    assert len(executor.batches) == 1
    waiting = [scheduler.submit(one_row(1e6 if i in bad else float(i)), 1) for i in range(8)]
    executor.finish()  # the worker takes the full batch of eight itself
    await first
    kept = [i for i in range(8) if i not in bad]
    if kept:
        assert len(executor.batches) == 2
        np.testing.assert_array_equal(executor.batches[1]["x"][:, 0], kept)
        executor.finish()
    else:
        assert len(executor.batches) == 1  # nothing to run
    results = await asyncio.gather(*waiting, return_exceptions=True)
    for i, result in enumerate(results):
        if i in bad:
            assert isinstance(result, InvalidInput)
            assert "element [0, 0] is 1000000.0: above the maximum 100" in result.message
        else:
            assert not isinstance(result, BaseException)
            np.testing.assert_array_equal(result[0], one_row(float(i))["x"] * 2)
    assert scheduler.busy_instances == 0 and scheduler.queue_depth == 0
