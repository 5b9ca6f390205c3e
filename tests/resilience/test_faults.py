"""Fault injection: error rate, error after N runs, added latency, hangs, cycle windows."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ortserve.config.resilience import FaultConfig
from ortserve.resilience.classify import FailureKind, InjectedFault
from ortserve.resilience.faults import FaultInjector
from ortserve.testing import FakeClock


def outcomes(injector: FaultInjector, runs: int) -> list[bool]:
    failed = []
    for _ in range(runs):
        try:
            injector.before_run("L0 primary")
        except InjectedFault:
            failed.append(True)
        else:
            failed.append(False)
    return failed


def test_error_after_n_fails_every_later_run_with_its_kind() -> None:
    injector = FaultInjector(FaultConfig(error_after=3, kind="transient"))
    assert outcomes(injector, 3) == [False] * 3
    with pytest.raises(InjectedFault) as caught:
        injector.before_run("L0 primary")
    assert caught.value.kind is FailureKind.TRANSIENT
    assert "L0 primary" in str(caught.value)
    assert injector.injected == 1


def test_error_rate_is_seeded_and_near_its_rate() -> None:
    first = outcomes(FaultInjector(FaultConfig(error_rate=0.3, seed=7)), 1000)
    again = outcomes(FaultInjector(FaultConfig(error_rate=0.3, seed=7)), 1000)
    assert first == again
    assert 240 < sum(first) < 360


def test_latency_is_added_to_every_run_and_a_hang_precedes_the_failure() -> None:
    slept: list[float] = []
    injector = FaultInjector(FaultConfig(latency_ms=5, hang_ms=300, error_after=1), sleep=slept.append)
    injector.before_run("L2 cpu session")
    assert slept == [0.005]
    with pytest.raises(InjectedFault):
        injector.before_run("L2 cpu session")
    assert slept == [0.005, 0.005, 0.3]


def test_a_cycle_window_switches_the_faults_on_and_off() -> None:
    clock = FakeClock()
    injector = FaultInjector(FaultConfig(error_rate=1.0, cycle_s=10, active_s=3), now=clock.now)
    assert outcomes(injector, 2) == [True, True]
    clock.advance(3.5)
    assert outcomes(injector, 2) == [False, False]
    clock.advance(7.0)  # 10.5 s: the next cycle's active part
    assert outcomes(injector, 1) == [True]


def test_cycle_and_active_go_together() -> None:
    with pytest.raises(ValidationError, match="cycle_s and active_s go together"):
        FaultConfig(cycle_s=10)


def test_an_offset_delays_the_first_cycle() -> None:
    clock = FakeClock()
    injector = FaultInjector(FaultConfig(error_rate=1.0, cycle_s=10, active_s=3, offset_s=5), now=clock.now)
    assert outcomes(injector, 1) == [False]
    clock.advance(5.5)
    assert outcomes(injector, 1) == [True]
    clock.advance(3.0)
    assert outcomes(injector, 1) == [False]
