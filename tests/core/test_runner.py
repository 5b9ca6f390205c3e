"""OrtRunner on a real session: inline jobs on the caller, others on its workers, chained."""

from __future__ import annotations

import math
import queue
import threading

import numpy as np
import onnxruntime as ort
import pytest

from model_builders import failing_model, serialized
from ortserve.core.job import BatchJob, RunResult
from ortserve.core.runner import OrtRunner


@pytest.fixture
def session() -> ort.InferenceSession:
    return ort.InferenceSession(serialized(failing_model()), providers=["CPUExecutionProvider"])


def feeds(rows: int) -> dict[str, np.ndarray]:
    return {"x": np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)}


class Completions:
    """Collects what the runner reports: (thread, outputs or None, error, chain)."""

    def __init__(self, following: list[BatchJob] | None = None) -> None:
        self.reports: queue.SimpleQueue[tuple[str, RunResult | None, BaseException | None, bool]] = (
            queue.SimpleQueue()
        )
        self._following = [] if following is None else following

    def job(self, rows: int, inline: bool = False) -> BatchJob:
        return BatchJob(feeds(rows), math.inf, inline, self._complete)

    def _complete(
        self, result: RunResult | None, error: BaseException | None, chain: bool
    ) -> BatchJob | None:
        self.reports.put((threading.current_thread().name, result, error, chain))
        return self._following.pop(0) if chain and self._following else None

    def next(self) -> tuple[str, RunResult | None, BaseException | None, bool]:
        return self.reports.get(timeout=10)


def test_an_inline_job_is_done_when_execute_returns(session: ort.InferenceSession) -> None:
    runner = OrtRunner(session, 1, "inline")
    done = Completions()
    try:
        runner.execute(done.job(3, inline=True))
        thread, result, error, chain = done.reports.get_nowait()
        assert thread == threading.current_thread().name and error is None and not chain
        assert result is not None
        np.testing.assert_array_equal(result[0][0], feeds(3)["x"].reshape(-1, 3))
        assert result[1] > 0
    finally:
        runner.close()


def test_other_jobs_run_on_a_worker(session: ort.InferenceSession) -> None:
    runner = OrtRunner(session, 1, "worker")
    done = Completions()
    try:
        runner.execute(done.job(3))
        thread, result, _, chain = done.next()
        assert thread == "ort-worker-0" and chain and result is not None
    finally:
        runner.close()


def test_a_worker_runs_the_job_its_completion_hands_back(session: ort.InferenceSession) -> None:
    # The next batch starts on the worker itself, without a round trip through the loop.
    following: list[BatchJob] = []
    done = Completions(following)
    following.extend([done.job(6), done.job(9)])
    runner = OrtRunner(session, 1, "chain")
    try:
        runner.execute(done.job(3))
        shapes = []
        for _ in range(3):
            thread, result, _, _ = done.next()
            assert thread == "ort-chain-0" and result is not None
            shapes.append(result[0][0].shape)
        assert shapes == [(4, 3), (8, 3), (12, 3)]
    finally:
        runner.close()


def test_a_failure_is_reported_as_the_jobs_error(session: ort.InferenceSession) -> None:
    runner = OrtRunner(session, 1, "failing")
    done = Completions()
    try:
        runner.execute(done.job(2, inline=True))  # 8 values cannot be reshaped to [-1, 3]
        _, result, error, _ = done.reports.get_nowait()
        assert result is None and error is not None
        runner.execute(done.job(2))
        _, result, error, _ = done.next()
        assert result is None and error is not None
    finally:
        runner.close()
