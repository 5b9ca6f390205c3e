"""The connection guards on a hand-driven clock: ping strikes, the stream-reset bucket, keepalive."""

from __future__ import annotations

from ortserve.server.http2.guards import FrameBudget, Keepalive, KeepaliveStep, PingStrikes


def test_pings_spaced_by_the_interval_never_strike() -> None:
    pings = PingStrikes(interval_s=10.0, max_strikes=2)
    assert not any(pings.ping(now, calls_open=False) for now in (0.0, 10.0, 20.0, 30.0, 40.0))


def test_the_third_early_ping_without_calls_strikes_out() -> None:
    pings = PingStrikes(interval_s=10.0, max_strikes=2)
    assert [pings.ping(now, calls_open=False) for now in (100.0, 101.0, 102.0, 103.0)] == [
        False,
        False,
        False,
        True,
    ]


def test_pings_while_calls_are_open_are_free() -> None:
    pings = PingStrikes(interval_s=10.0, max_strikes=2)
    assert not any(pings.ping(100.0 + i * 0.01, calls_open=True) for i in range(50))


def test_opening_a_call_forgives_the_strikes() -> None:
    pings = PingStrikes(interval_s=10.0, max_strikes=2)
    for now in (100.0, 101.0, 102.0):
        pings.ping(now, calls_open=False)
    pings.forgive()
    assert not pings.ping(103.0, calls_open=False)
    assert not pings.ping(104.0, calls_open=False)


def test_resets_within_the_burst_pass_and_one_more_does_not() -> None:
    budget = FrameBudget(rate=10.0, burst=5.0)
    assert [budget.charge(50.0) for _ in range(6)] == [False] * 5 + [True]


def test_the_bucket_refills_at_its_rate_up_to_the_burst() -> None:
    budget = FrameBudget(rate=10.0, burst=5.0)
    for _ in range(5):
        budget.charge(50.0)
    assert not budget.charge(50.1)  # 0.1 s at 10/s gave one token back
    assert budget.charge(50.1)
    # A long pause refills only up to the burst.
    assert [budget.charge(1000.0) for _ in range(6)] == [False] * 5 + [True]


def test_keepalive_waits_out_the_quiet_time_then_pings() -> None:
    keepalive = Keepalive(time_s=30.0, timeout_s=5.0)
    assert keepalive.step(now=110.0, last_read=100.0) == (KeepaliveStep.WAIT, 20.0)
    assert keepalive.step(now=130.0, last_read=100.0) == (KeepaliveStep.PING, 5.0)


def test_an_unanswered_ping_closes_and_an_answered_one_starts_over() -> None:
    keepalive = Keepalive(time_s=30.0, timeout_s=5.0)
    keepalive.step(now=130.0, last_read=100.0)  # ping sent at 130
    assert keepalive.step(now=133.0, last_read=100.0) == (KeepaliveStep.WAIT, 5.0)
    assert keepalive.step(now=135.0, last_read=100.0) == (KeepaliveStep.CLOSE, 0.0)
    keepalive.acknowledged()
    assert keepalive.step(now=136.0, last_read=136.0) == (KeepaliveStep.WAIT, 30.0)
