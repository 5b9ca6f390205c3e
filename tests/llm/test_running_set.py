"""The running set's size rule alone, with no decoder: the explore bound, the floor of rows,
the pause once the decode has stayed beyond its bound, the room kept for the smallest prefill
chunk, and the default latency target."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from ortserve.llm.running_set import SHRINK_AFTER, STEP_TAIL, RunningSetSize, default_itl_target_s
from ortserve.llm.scheduler import StepCostModel


@dataclass
class _Params:
    max_tokens: int = 16


@dataclass
class _Row:
    length: int = 100
    params: _Params = field(default_factory=_Params)
    output: list[int] = field(default_factory=list)


def _rows(count: int) -> list[_Row]:
    return [_Row() for _ in range(count)]


def test_the_set_grows_at_most_half_again_past_the_widest_step_measured() -> None:
    size = RunningSetSize(max_num_seqs=64)
    cheap = StepCostModel(0.001, 0.0001)  # every row pays: only the explore bound stops it
    assert not size.is_full(cheap, _rows(3), _Row(), 10.0)  # type: ignore[arg-type]
    assert size.is_full(cheap, _rows(4), _Row(), 10.0)  # type: ignore[arg-type]  # nothing measured yet
    size.after_step(decoded=8, decode_s=0.001, itl_target_s=10.0)
    assert not size.is_full(cheap, _rows(11), _Row(), 10.0)  # type: ignore[arg-type]
    assert size.is_full(cheap, _rows(12), _Row(), 10.0)  # type: ignore[arg-type]


def test_a_few_rows_always_run_and_the_bound_stops_the_rest() -> None:
    size = RunningSetSize(max_num_seqs=64)
    size.after_step(decoded=40, decode_s=0.001, itl_target_s=10.0)
    slow = StepCostModel(0.05, 0.0001)  # a step already past half of a 40 ms target
    assert not size.is_full(slow, _rows(3), _Row(), 0.04)  # type: ignore[arg-type]
    assert size.is_full(slow, _rows(4), _Row(), 0.04)  # type: ignore[arg-type]


def test_the_newest_is_paused_only_after_the_decode_stays_beyond_its_bound() -> None:
    size = RunningSetSize(max_num_seqs=64)
    over = 1.3 * size.growth_bound_s(0.04)
    paused = [size.after_step(decoded=10, decode_s=over, itl_target_s=0.04) for _ in range(SHRINK_AFTER + 1)]
    assert paused == [False] * SHRINK_AFTER + [True]
    assert size.is_full(StepCostModel(0.001, 0.0001), _rows(5), _Row(), 0.04)  # type: ignore[arg-type]
    assert not size.after_step(decoded=10, decode_s=0.001, itl_target_s=0.04)  # back in bound
    assert size.decode_over == 0
    assert not size.after_step(decoded=4, decode_s=over, itl_target_s=0.04)  # never below the floor


def test_the_decode_leaves_the_smallest_chunk_room_at_the_steps_tail() -> None:
    size = RunningSetSize(max_num_seqs=64)
    assert size.growth_bound_s(0.04) == pytest.approx(0.02)  # no chunk measured: half the target
    size.reserve_s = 0.018  # a 32-token chunk of the 30.6M decoder on one core
    bound = size.growth_bound_s(0.04)
    assert bound == pytest.approx(0.04 / STEP_TAIL - 0.018)
    assert STEP_TAIL * (bound + size.reserve_s) == pytest.approx(0.04)  # the tail meets the target
    size.reserve_s = 0.05  # a chunk beyond the target: only the floor of rows runs
    assert size.growth_bound_s(0.04) == 0.0
    size.after_step(decoded=40, decode_s=0.001, itl_target_s=10.0)
    cheap = StepCostModel(0.001, 0.0001)
    assert not size.is_full(cheap, _rows(3), _Row(), 0.04)  # type: ignore[arg-type]
    assert size.is_full(cheap, _rows(4), _Row(), 0.04)  # type: ignore[arg-type]


def test_a_tight_target_admits_fewer_rows_than_half_of_it_would() -> None:
    def rows_admitted(reserve_s: float) -> int:
        size = RunningSetSize(max_num_seqs=64)
        size.after_step(decoded=60, decode_s=0.001, itl_target_s=10.0)
        size.reserve_s = reserve_s
        cost = StepCostModel(0.004, 0.0001, row_s=0.001)  # 4 ms a step, 1 ms a row
        rows = 0
        while not size.is_full(cost, _rows(rows), _Row(), 0.04):  # type: ignore[arg-type]
            rows += 1
        return rows

    assert rows_admitted(0.0) > rows_admitted(0.018) >= 4


@pytest.mark.parametrize(
    ("one_row_s", "chunk_s"), [(0.0045, 0.0165), (0.006, 0.004), (0.01, 0.05), (0.001, 0.001)]
)
def test_the_default_target_holds_half_of_it_in_decode_beside_the_smallest_chunk(
    one_row_s: float, chunk_s: float
) -> None:
    target = default_itl_target_s(one_row_s, chunk_s)
    assert target >= max(10.0 * one_row_s, 0.02)
    size = RunningSetSize(max_num_seqs=64)
    size.reserve_s = chunk_s
    assert size.growth_bound_s(target) == pytest.approx(target / 2.0)
    if chunk_s / (1.0 / STEP_TAIL - 0.5) > max(10.0 * one_row_s, 0.02):  # the chunk sets it
        assert STEP_TAIL * (target / 2.0 + chunk_s) == pytest.approx(target)
