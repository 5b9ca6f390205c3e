"""The request bytes one gRPC connection holds: its own bound, the server-wide budget, and every
byte given back however a call ends (a hypothesis run of random holds and releases)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ortserve.server.connections import ByteBudget
from ortserve.server.grpc.held import OVER_BUDGET, OVER_LIMIT, HeldBytes


def test_a_call_growing_past_the_connections_bound_is_told_to_fail() -> None:
    budget = ByteBudget(1000)
    held = HeldBytes(budget, limit=100)
    assert held.update(1, 60) is None
    assert held.update(3, 40) is None
    assert held.update(3, 41) == OVER_LIMIT  # the newest growing call fails
    held.released(3)
    assert budget.held == 60
    assert held.update(3, 40) is None


def test_a_call_the_server_wide_budget_cannot_hold_is_told_to_fail_and_holds_nothing_more() -> None:
    budget = ByteBudget(50)
    held = HeldBytes(budget, limit=1000)
    assert held.update(1, 30) is None
    assert held.update(1, 60) == OVER_BUDGET
    assert budget.held == 30
    assert held.update(1, 10) is None  # it shrank: 20 given back
    assert budget.held == 10


def test_a_message_taken_before_its_call_counts_on_both_bounds() -> None:
    budget = ByteBudget(150)
    held = HeldBytes(budget, limit=100)
    assert held.take(70)
    assert not held.take(90)  # the budget would pass its bound: nothing taken
    assert held.update(1, 31) == OVER_LIMIT  # 70 + 31 over the connection's 100
    held.give(70)
    held.released(1)
    assert budget.held == 0


_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("update"), st.integers(1, 4), st.integers(0, 80)),
        st.tuples(st.just("released"), st.integers(1, 4), st.just(0)),
        st.tuples(st.just("take"), st.just(0), st.integers(0, 80)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(_STEPS, st.booleans())
def test_every_byte_held_goes_back_to_the_budget(steps: list[tuple[str, int, int]], clear: bool) -> None:
    budget = ByteBudget(200)
    held = HeldBytes(budget, limit=150)
    by_stream: dict[int, int] = {}
    taken: list[int] = []
    for op, stream_id, size in steps:
        if op == "update":
            if held.update(stream_id, size) != OVER_BUDGET:
                by_stream[stream_id] = size
        elif op == "released":
            held.released(stream_id)
            by_stream.pop(stream_id, None)
        elif held.take(size):
            taken.append(size)
        assert budget.held == sum(by_stream.values()) + sum(taken) <= budget.limit
    if clear:
        held.clear()
    else:
        for size in taken:
            held.give(size)
        for stream_id in list(by_stream):
            held.released(stream_id)
    assert budget.held == 0
