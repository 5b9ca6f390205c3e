"""SLO objectives: parsing ``--slo`` texts and judging measurements against them."""

from __future__ import annotations

import pytest

from ortserve.loadtest.measurement import Measurement
from ortserve.loadtest.slo import judge, parse_objective


@pytest.mark.parametrize(
    ("text", "metric", "limit"),
    [
        ("p99=20ms", "p99", 20_000.0),
        ("p99.9=1.5s", "p99.9", 1_500_000.0),
        ("max=750us", "max", 750.0),
        ("error_rate=0.1%", "error_rate", 0.001),
        ("error_rate=0.02", "error_rate", 0.02),
        ("rate=500/s", "rate", 500.0),
    ],
)
def test_objectives_parse_with_their_units(text: str, metric: str, limit: float) -> None:
    objective = parse_objective(text)
    assert objective.metric == metric
    assert objective.limit == pytest.approx(limit)


@pytest.mark.parametrize("text", ["p99", "p99=20", "p101=1ms", "latency=3ms", "error_rate=3ms", "rate=4ms"])
def test_malformed_objectives_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_objective(text)


def _measurement(latencies_us: list[int], errors: int) -> Measurement:
    measurement = Measurement(elapsed_s=1.0)
    for latency in latencies_us:
        measurement.record(0, 200, latency)
    for _ in range(errors):
        measurement.record(0, 503, 0)
    return measurement


def test_latency_and_error_objectives_pass_and_fail() -> None:
    measurement = _measurement([1_000] * 98 + [30_000] * 2, errors=1)
    verdicts = judge(
        [
            parse_objective(t)
            for t in ("p50=2ms", "p99=20ms", "error_rate=1%", "error_rate=0.5%", "rate=50/s")
        ],
        [("level", measurement)],
    )
    assert [v.ok for v in verdicts] == [True, False, True, False, True]
    assert verdicts[1].measured == pytest.approx(30_000, rel=0.001)
