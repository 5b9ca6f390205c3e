"""OrtRunner on a real session: short batches run inline on the loop, others on its workers."""

from __future__ import annotations

import asyncio
import math
import threading

import numpy as np
import onnxruntime as ort
import pytest

from model_builders import failing_model, serialized
from ortserve.core.runner import OrtRunner


@pytest.fixture
def session() -> ort.InferenceSession:
    return ort.InferenceSession(serialized(failing_model()), providers=["CPUExecutionProvider"])


def feeds(rows: int) -> dict[str, np.ndarray]:
    return {"x": np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)}


async def test_a_short_run_is_done_when_execute_returns(session: ort.InferenceSession) -> None:
    runner = OrtRunner(session, 1, asyncio.get_running_loop(), "inline")
    try:
        future = runner.execute(feeds(3), expected_s=runner.inline_below_s / 2)
        assert future.done()
        outputs, seconds = future.result()
        np.testing.assert_array_equal(outputs[0], feeds(3)["x"].reshape(-1, 3))
        assert seconds > 0
    finally:
        runner.close()


async def test_an_unknown_or_long_run_goes_to_a_worker(session: ort.InferenceSession) -> None:
    runner = OrtRunner(session, 1, asyncio.get_running_loop(), "worker")
    ran_on: list[str] = []
    original = runner.run_blocking

    def recording(batch: dict[str, np.ndarray]) -> tuple[list[np.ndarray], float]:
        ran_on.append(threading.current_thread().name)
        return original(batch)

    runner.run_blocking = recording  # type: ignore[method-assign, assignment]
    try:
        for expected in (math.inf, runner.inline_below_s * 10):
            future = runner.execute(feeds(3), expected_s=expected)
            assert not future.done()
            await future
        assert ran_on == ["ort-worker-0", "ort-worker-0"]
    finally:
        runner.close()


async def test_a_short_run_waits_its_turn_while_a_worker_is_busy(session: ort.InferenceSession) -> None:
    runner = OrtRunner(session, 1, asyncio.get_running_loop(), "busy")
    try:
        queued = runner.execute(feeds(3), expected_s=math.inf)
        behind = runner.execute(feeds(3), expected_s=0.0)
        assert not behind.done()  # not run beside the worker's batch
        await asyncio.gather(queued, behind)
        assert runner.execute(feeds(3), expected_s=0.0).done()  # the worker is idle again
    finally:
        runner.close()


async def test_an_inline_failure_is_the_futures_exception(session: ort.InferenceSession) -> None:
    runner = OrtRunner(session, 1, asyncio.get_running_loop(), "failing")
    try:
        future = runner.execute(feeds(2), expected_s=0.0)  # 8 values cannot be reshaped to [-1, 3]
        assert future.done() and future.exception() is not None
    finally:
        runner.close()
