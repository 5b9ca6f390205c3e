"""The model keeps running while the event loop is too busy to dispatch (issue 10)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import onnxruntime as ort

from model_builders import failing_model, serialized
from ortserve.core.clock import LoopClock
from ortserve.core.job import RunResult
from ortserve.core.policy import SchedulingPolicy
from ortserve.core.runner import OrtRunner
from ortserve.core.scheduler import Scheduler


class GatedRunner(OrtRunner):
    """A real runner whose runs wait for the test to open its gate; counts the runs."""

    def __init__(self) -> None:
        session = ort.InferenceSession(serialized(failing_model()), providers=["CPUExecutionProvider"])
        super().__init__(session, 1, "gated")
        self.inline_below_s = 0.0
        self.gate = threading.Event()
        self.half = threading.Event()  # set once 15 of the test's 30 batches ran
        self.runs = 0

    def run_blocking(self, feeds: dict[str, np.ndarray]) -> RunResult:
        assert self.gate.wait(10), "the test never opened the gate"
        result = super().run_blocking(feeds)
        self.runs += 1
        if self.runs == 15:
            self.half.set()
        return result


async def test_the_runner_stays_busy_while_intake_saturates_the_loop() -> None:
    loop = asyncio.get_running_loop()
    runner = GatedRunner()
    scheduler = Scheduler(
        runner, SchedulingPolicy(max_batch_size=1, max_queue_wait_s=0.0), LoopClock(loop), loop
    )
    try:
        futures = [scheduler.submit({"x": np.zeros((3, 4), dtype=np.float32)}, 1) for _ in range(30)]
        # The loop is now "parsing requests" without a break (this callback holds it, up to
        # 2 s): no callback runs. The worker must not wait for it between batches; the first
        # starts now, in its thread.
        runner.gate.set()
        runner.half.wait(2)
        assert runner.runs >= 15, f"only {runner.runs} batches ran while the loop was busy"
        outputs = await asyncio.gather(*futures)
        assert all(out[0].shape == (4, 3) for out in outputs)
    finally:
        runner.close()
