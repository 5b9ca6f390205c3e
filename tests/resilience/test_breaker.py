"""The circuit breaker on a fake clock: opening, probing, closing, forced open."""

from __future__ import annotations

import threading

from ortserve.resilience.breaker import Breaker, BreakerPolicy, BreakerState
from ortserve.resilience.classify import FailureKind, InjectedFault, classify
from ortserve.testing import FakeClock

P = FailureKind.PERSISTENT
T = FailureKind.TRANSIENT


def breaker(clock: FakeClock, **policy: float) -> Breaker:
    return Breaker(BreakerPolicy(**policy), clock.now)  # type: ignore[arg-type]


def state_of(b: Breaker) -> BreakerState:
    return b.state


def test_consecutive_persistent_failures_open_it_and_a_success_resets_the_count() -> None:
    clock = FakeClock()
    b = breaker(clock, consecutive_failures=3, min_runs=1000)
    assert not b.record(P) and not b.record(P)
    assert not b.record(None)  # the run of failures is broken
    assert not b.record(P) and not b.record(P)
    assert b.allows
    assert b.record(P)
    assert b.state is BreakerState.OPEN and not b.allows
    assert "3 consecutive persistent failures" in b.reason


def test_transient_failures_never_count_as_consecutive_but_count_in_the_rate_window() -> None:
    clock = FakeClock()
    b = breaker(clock, consecutive_failures=2, failure_rate=0.5, min_runs=10, window_s=10.0)
    for _ in range(4):
        assert not b.record(T)
        assert not b.record(None)
    assert not b.record(T)  # 5 of 9
    assert b.record(None) is False and b.record(T)  # 6 of 11 failed
    assert "6 of 11 runs failed" in b.reason


def test_runs_older_than_the_window_are_forgotten() -> None:
    clock = FakeClock()
    b = breaker(clock, consecutive_failures=100, failure_rate=0.5, min_runs=4, window_s=10.0)
    for _ in range(3):
        b.record(T)
    clock.advance(11.0)
    assert not b.record(None) and not b.record(None) and not b.record(T)
    assert b.allows


def test_a_probe_is_due_after_open_s_and_its_success_closes_the_breaker() -> None:
    clock = FakeClock()
    b = breaker(clock, consecutive_failures=1, open_s=2.0)
    b.record(P)
    assert b.probe_at() == clock.now() + 2.0
    assert not b.begin_probe()  # not due yet
    clock.advance(2.0)
    assert b.begin_probe()
    assert b.state is BreakerState.HALF_OPEN and not b.allows
    assert not b.begin_probe()  # one probe at a time
    b.end_probe(True)
    assert state_of(b) is BreakerState.CLOSED and b.allows


def test_a_failed_probe_reopens_and_doubles_the_wait_up_to_the_cap() -> None:
    clock = FakeClock()
    b = breaker(clock, consecutive_failures=1, open_s=2.0, max_open_s=5.0)
    b.record(P)
    waits = []
    for _ in range(3):
        due = b.probe_at()
        assert due is not None
        waits.append(due - clock.now())
        clock.advance(due - clock.now())
        assert b.begin_probe()
        b.end_probe(False, "probe failed: still broken")
    assert waits == [2.0, 4.0, 5.0]
    assert b.reason == "probe failed: still broken"
    clock.advance(5.0)
    assert b.begin_probe()
    b.end_probe(True)
    assert b.probe_at() is None
    b.record(P)
    assert b.probe_at() == clock.now() + 2.0  # the wait starts over after a recovery


def test_failures_while_open_do_not_reopen_or_move_the_probe() -> None:
    clock = FakeClock()
    b = breaker(clock, consecutive_failures=1, open_s=2.0)
    b.record(P)
    due = b.probe_at()
    clock.advance(1.0)
    assert not b.record(P)
    assert b.probe_at() == due


def test_a_hold_keeps_traffic_off_a_closed_breaker_and_never_closes_an_open_one() -> None:
    clock = FakeClock()
    b = Breaker(BreakerPolicy(), clock.now)
    assert b.allows
    b.hold("GPU 0 temperature 90 C > 85 C for 3 samples")
    assert b.state is BreakerState.CLOSED and not b.allows and b.reason.startswith("GPU 0 temperature")
    b.hold(None)
    assert b.allows
    for _ in range(3):
        b.record(P)
    assert b.state is BreakerState.OPEN and not b.allows
    b.hold("GPU 0 memory 95% > 92%")
    b.hold(None)
    assert not b.allows  # only a good probe closes it
    clock.advance(BreakerPolicy().open_s)
    assert b.begin_probe()
    b.hold("GPU 0 memory 95% > 92%")
    b.end_probe(True)
    assert b.state is BreakerState.CLOSED and not b.allows  # closed, but its device is still held
    b.hold(None)
    assert b.allows


def test_trip_opens_a_closed_breaker_with_its_reason() -> None:
    clock = FakeClock()
    b = breaker(clock)
    b.trip("could not be built")
    assert b.state is BreakerState.OPEN and b.reason == "could not be built"


class InvalidArgument(Exception):
    """Named as ONNX Runtime's class for INVALID_ARGUMENT."""


class Fail(Exception):
    """Named as ONNX Runtime's generic failure class."""


def test_classification_of_run_failures() -> None:
    assert classify(InvalidArgument("Got invalid dimensions for input: x")) is FailureKind.INPUT
    assert classify(Fail("CUDA failure 700: an illegal memory access")) is FailureKind.PERSISTENT
    assert (
        classify(Fail("bad_alloc: Failed to allocate memory for requested buffer")) is FailureKind.TRANSIENT
    )
    assert classify(MemoryError()) is FailureKind.TRANSIENT
    assert classify(RuntimeError("something nobody foresaw")) is FailureKind.PERSISTENT
    assert classify(InjectedFault(FailureKind.INPUT, "x")) is FailureKind.INPUT


def test_successes_counted_without_the_lock_are_not_lost_across_threads() -> None:
    """Four threads count 20,000 successes outside the lock; the window must hold them all:
    with 20,000 failures on top, the rate opens exactly at the 20,000th (half of the runs)."""
    clock = FakeClock()
    b = breaker(clock, consecutive_failures=10**9, failure_rate=0.5, min_runs=1, window_s=10.0)

    def count() -> None:
        for _ in range(5000):
            b.succeeded()

    threads = [threading.Thread(target=count) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not any(b.record(T) for _ in range(19_999))
    assert b.record(T)
    assert "20000 of 40000 runs failed" in b.reason
