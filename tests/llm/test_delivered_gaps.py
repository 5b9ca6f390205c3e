"""The gaps the ITL guard watches: from one decode step's events written by the event loop to
the next's, paired with the engine's steps in order, and the hand-off times when no loop writes
them (or one stopped answering)."""

from __future__ import annotations

from ortserve.llm.itl_guard import DeliveredGaps


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_without_a_loop_the_gaps_are_between_hand_offs_of_decode_steps() -> None:
    gaps = DeliveredGaps(Clock())
    assert gaps.emitted(1.0, decoded=False) == []  # a prompt's first token: no gap yet
    assert [round(g, 3) for g in gaps.emitted(1.05, decoded=True)] == [0.05]
    gaps.delivered()  # nothing is attached: ignored
    assert [round(g, 3) for g in gaps.emitted(1.12, decoded=True)] == [0.07]


def test_with_a_loop_the_gaps_are_between_writes_paired_with_steps_in_order() -> None:
    clock = Clock()
    gaps = DeliveredGaps(clock)
    gaps.attach()
    assert gaps.emitted(1.0, decoded=False) == []  # not written yet
    clock.now = 1.004
    gaps.delivered()
    assert gaps.emitted(1.05, decoded=True) == []  # the first step written, no gap before it
    assert gaps.emitted(1.10, decoded=True) == []  # the loop is behind by two steps
    clock.now = 1.080
    gaps.delivered()
    clock.now = 1.101
    gaps.delivered()
    found = gaps.emitted(1.15, decoded=True)
    assert [round(g, 3) for g in found] == [0.076, 0.021]  # what clients saw, not 0.05 and 0.05


def test_a_loop_that_stops_answering_gives_the_gaps_back_to_the_hand_off() -> None:
    gaps = DeliveredGaps(Clock())
    gaps.attach()
    at = 0.0
    for _ in range(DeliveredGaps._MAX_PENDING + 1):
        at += 0.05
        assert gaps.emitted(at, decoded=True) == []
    assert gaps.emitted(at + 0.05, decoded=True) == []  # the first after giving up: no gap yet
    assert [round(g, 3) for g in gaps.emitted(at + 0.11, decoded=True)] == [0.06]
