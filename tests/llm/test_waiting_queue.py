"""The waiting queue's expected wait for a first token, with no engine: what is queued, what
the admitted have still to prefill, and the measured finish rate."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from ortserve.errors import Overloaded
from ortserve.llm.limits import EngineLimits
from ortserve.llm.scheduler import RATE_SIGMAS, WaitingQueue


@dataclass
class _Waiting:
    length: int
    priority: int = 0
    deadline: float | None = None


def _finishing(per_second: float, seconds: int = 200) -> WaitingQueue:
    """A queue whose running sequences have finished at ``per_second`` for ``seconds``."""
    queue = WaitingQueue()
    for tick in range(seconds):
        queue.finished(1, tick / per_second)
    return queue


def test_a_newcomer_waits_for_the_admitted_prompts_prefill_too() -> None:
    queue = WaitingQueue()
    queue.push(_Waiting(length=300))  # type: ignore[arg-type]
    alone = queue.expected_wait(1, 100, full=False, prefill_s=0.001, now=0.0)
    assert alone == pytest.approx((300 + 100) * 0.001)
    queue.backlog_tokens = 2000  # admitted, not yet prefilled
    assert queue.expected_wait(1, 100, full=False, prefill_s=0.001, now=0.0) == pytest.approx(alone + 2.0)


def test_when_the_set_is_full_the_backlog_adds_to_one_finish_for_each_ahead() -> None:
    queue = _finishing(per_second=2.0)
    now = 100.0
    rate = queue.finish_rate(now)
    assert rate == pytest.approx((1.0 - RATE_SIGMAS / math.sqrt(127)) * 2.0, rel=0.02)
    without = queue.expected_wait(9, 100, full=True, prefill_s=0.001, now=now)
    assert without == pytest.approx(0.1 + 10 / rate)
    queue.backlog_tokens = 3000
    assert queue.expected_wait(9, 100, full=True, prefill_s=0.001, now=now) == pytest.approx(without + 3.0)


def test_the_fewer_finishes_counted_the_further_below_them_the_rate_is_priced() -> None:
    few, many = WaitingQueue(), WaitingQueue()
    for tick in range(10):
        few.finished(1, float(tick))
    for tick in range(200):
        many.finished(1, float(tick))
    assert few.finish_rate(9.0) < many.finish_rate(199.0) < 1.0  # one finish a second, measured
    assert few.finish_rate(9.0) >= 0.5  # never priced below half what is measured


def test_the_backlog_can_turn_an_admission_into_a_refusal_with_retry_after() -> None:
    queue = _finishing(per_second=2.0)
    limits = EngineLimits(max_waiting=256, max_queue_wait_s=7.0)
    for _ in range(9):
        queue.push(_Waiting(length=100))  # type: ignore[arg-type]
    queue.push_within(_Waiting(length=100), limits, full=True, prefill_s=0.001, now=100.0)  # type: ignore[arg-type]
    queue.backlog_tokens = 3000  # 3 s more: past the 7 s bound
    with pytest.raises(Overloaded) as refused:
        queue.push_within(_Waiting(length=100), limits, full=True, prefill_s=0.001, now=100.0)  # type: ignore[arg-type]
    assert refused.value.retry_after_s is not None and refused.value.retry_after_s >= 1.0
