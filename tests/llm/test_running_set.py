"""The running set's size rule alone, with no decoder: the explore bound, the floor of rows,
and the pause once the decode has stayed beyond its bound."""

from __future__ import annotations

from dataclasses import dataclass, field

from ortserve.llm.running_set import SHRINK_AFTER, RunningSetSize
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
