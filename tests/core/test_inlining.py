"""The inline-or-worker choice: from the median of recent runs, stable against outliers."""

from __future__ import annotations

import asyncio

import numpy as np

from fake_executor import FakeExecutor
from ortserve.core.costmodel import BatchCostModel
from ortserve.core.inlining import InlineGate
from ortserve.core.policy import SchedulingPolicy
from ortserve.core.scheduler import Scheduler
from ortserve.testing import FakeClock

LIMIT = 100e-6


def test_the_prediction_decides_until_a_size_class_has_runs_of_its_own() -> None:
    gate = InlineGate()
    assert gate.allows(1, 50e-6, LIMIT)
    assert not gate.allows(1, 150e-6, LIMIT)
    for _ in range(4):
        gate.observe(1, 500e-6)
    assert gate.median_s(1) is None
    assert gate.allows(1, 50e-6, LIMIT)


def test_preempted_runs_do_not_move_a_fast_class_off_the_loop() -> None:
    # A 30 us run with every third one preempted for 4 ms: the mean is 1.3 ms, the median 30 us.
    gate = InlineGate()
    for i in range(30):
        gate.observe(1, 4e-3 if i % 3 == 0 else 30e-6)
    assert gate.median_s(1) == 30e-6
    assert gate.allows(1, 1.3e-3, LIMIT)


def test_size_classes_are_decided_apart() -> None:
    gate = InlineGate()
    for _ in range(5):
        gate.observe(1, 20e-6)
        gate.observe(32, 400e-6)
    assert gate.allows(1, 0.0, LIMIT)
    assert gate.allows(3, 0.0, LIMIT)  # 2-3 rows: no runs yet, the prediction decides
    assert not gate.allows(32, 0.0, LIMIT)
    assert not gate.allows(63, 0.0, LIMIT)  # 32-63 rows share a class


def test_a_median_near_the_limit_keeps_the_path_it_is_on() -> None:
    inline, worker = InlineGate(), InlineGate()
    for _ in range(15):
        inline.observe(1, 90e-6)
        worker.observe(1, 110e-6)
    assert inline.allows(1, 0.0, LIMIT) and not worker.allows(1, 0.0, LIMIT)
    for _ in range(15):  # both now at 105 us: inside the band, neither moves
        inline.observe(1, 105e-6)
        worker.observe(1, 105e-6)
    assert inline.allows(1, 0.0, LIMIT) and not worker.allows(1, 0.0, LIMIT)
    for _ in range(15):  # clearly past the band: both move
        inline.observe(1, 130e-6)
        worker.observe(1, 70e-6)
    assert not inline.allows(1, 0.0, LIMIT) and worker.allows(1, 0.0, LIMIT)


def test_a_limit_of_zero_never_runs_inline() -> None:
    gate = InlineGate()
    for _ in range(5):
        gate.observe(1, 1e-6)
    assert not gate.allows(1, 1e-6, 0.0)


async def test_identical_versions_warmed_up_differently_take_the_same_path() -> None:
    # Two schedulers of the same model whose warm-ups left predictions either side of the
    # limit (90 us and 110 us for one row); their runs take 30 us, every fourth preempted for
    # 3 ms. The cost model's mean (about 0.8 ms) would send both to a worker for good; from
    # its fifth run on, each one-row class has a median of its own and both run inline.
    loop = asyncio.get_running_loop()
    paths: list[list[bool]] = []
    for warm_s in (90e-6, 110e-6):
        cost = BatchCostModel()
        cost.observe(1, warm_s)
        executor = FakeExecutor()
        executor.inline_below_s = LIMIT
        scheduler = Scheduler(executor, SchedulingPolicy(max_batch_size=8), FakeClock(), loop, cost)
        for i in range(40):
            future = scheduler.submit({"x": np.zeros((1, 4), dtype=np.float32)}, 1)
            for _ in range(3):  # the idle scheduler dispatches at the end of the tick
                await asyncio.sleep(0)
            executor.finish(seconds=3e-3 if i % 4 == 0 else 30e-6)
            await future
        paths.append(executor.inline)
    assert paths[0][0] and not paths[1][0]  # no runs yet: the predictions decide
    assert paths[0][5:] == paths[1][5:] == [True] * 35
