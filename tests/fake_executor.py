"""A batch executor whose runs finish when a test says so, and an observer keeping batch records
(scheduler and loader tests, no real model behind the executor)."""

from __future__ import annotations

import asyncio

import numpy as np

from ortserve.core.job import BatchJob, RunResult
from ortserve.core.observer import BatchRecord
from ortserve.errors import OrtServeError

Feeds = dict[str, np.ndarray]


class FakeExecutor:
    """Records each batch; the test decides when it finishes (outputs = inputs * 2).

    Like the real runner's workers, finishing a batch takes the next ready one at once.
    """

    inline_below_s = 0.0  # never inline: these tests drive runs by hand

    def __init__(self, instances: int = 1) -> None:
        self._instances = instances
        self.batches: list[Feeds] = []
        self.expected: list[float] = []
        self.running: list[BatchJob] = []
        self.inline: list[bool] = []

    @property
    def instances(self) -> int:
        return self._instances

    def execute(self, job: BatchJob) -> None:
        self.expected.append(job.expected_s)
        self.inline.append(job.inline)
        self.batches.append(job.feeds)
        self.running.append(job)

    def _complete(self, index: int, result: RunResult | None, error: BaseException | None) -> None:
        job = self.running.pop(index)
        following = job.complete(result, error, chain=not job.inline)
        if following is not None:
            self.execute(following)

    def finish(self, index: int = 0, seconds: float = 0.001) -> None:
        self._complete(index, ([self.running[index].feeds["x"] * 2], seconds), None)

    def fail(self, index: int = 0) -> None:
        self._complete(index, None, RuntimeError("device fault"))

    def cancel(self, index: int = 0) -> None:
        self._complete(index, None, asyncio.CancelledError())


class BatchRecorder:
    """A scheduler observer keeping every batch record (rejections are not its business)."""

    def __init__(self) -> None:
        self.records: list[BatchRecord] = []

    def on_batch(self, record: BatchRecord) -> None:
        self.records.append(record)

    def on_rejected(self, error: OrtServeError) -> None:
        pass
