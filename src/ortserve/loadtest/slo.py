"""Service-level objectives: ``--slo p99=20ms`` / ``error_rate=0.1%`` parsing and the verdict."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ortserve.loadtest.measurement import Measurement

__all__ = ["Objective", "Verdict", "judge", "parse_objective"]

_UNITS_US = {"us": 1.0, "µs": 1.0, "ms": 1_000.0, "s": 1_000_000.0}
_LATENCY = re.compile(r"^(?:p(\d+(?:\.\d+)?)|max|mean)$")
_NUMBER = re.compile(r"^(\d+(?:\.\d+)?)\s*(us|µs|ms|s|%|/s)?$")


@dataclass(frozen=True, slots=True)
class Objective:
    """One bound: ``metric`` (p<N>, max, mean, error_rate, rate) and its limit.

    Latency limits are microseconds, ``error_rate`` a fraction (upper bounds), ``rate``
    requests per second (a lower bound).
    """

    metric: str
    limit: float
    text: str

    def measure(self, measurement: Measurement) -> float:
        """The measured value in the objective's unit."""
        histogram = measurement.latency
        if self.metric == "error_rate":
            return measurement.error_rate
        if self.metric == "rate":
            return measurement.achieved_rate
        if self.metric == "max":
            return float(histogram.max_value)
        if self.metric == "mean":
            return histogram.mean()
        return float(histogram.percentile(float(self.metric[1:])))

    def met_by(self, value: float) -> bool:
        return value >= self.limit if self.metric == "rate" else value <= self.limit


@dataclass(frozen=True, slots=True)
class Verdict:
    """An objective, what was measured at one level, and whether it held."""

    objective: Objective
    level: str
    measured: float
    ok: bool


def parse_objective(text: str) -> Objective:
    """Parse ``p99=20ms``, ``p99.9=50ms``, ``max=1s``, ``error_rate=0.1%``, ``rate=500/s``.

    Raises:
        ValueError: not one of those forms.
    """
    name, sep, raw = text.replace(" ", "").partition("=")
    number = _NUMBER.match(raw)
    if not sep or number is None:
        raise ValueError(f"SLO {text!r}: expected NAME=VALUE, e.g. p99=20ms or error_rate=0.1%")
    value, unit = float(number.group(1)), number.group(2)
    if name == "error_rate":
        if unit not in (None, "%"):
            raise ValueError(f"SLO {text!r}: error_rate is a fraction or a percentage")
        return Objective(name, value / 100 if unit == "%" else value, text)
    if name == "rate":
        if unit not in (None, "/s"):
            raise ValueError(f"SLO {text!r}: rate is requests per second")
        return Objective(name, value, text)
    latency = _LATENCY.match(name)
    if latency is None or (latency.group(1) is not None and not 0 < float(latency.group(1)) <= 100):
        raise ValueError(f"SLO {text!r}: unknown metric {name!r} (p<N>, max, mean, error_rate, rate)")
    if unit not in _UNITS_US:
        raise ValueError(f"SLO {text!r}: a latency needs a unit (us, ms, s)")
    return Objective(name, value * _UNITS_US[unit], text)


def judge(objectives: list[Objective], levels: list[tuple[str, Measurement]]) -> list[Verdict]:
    """Every objective at every level."""
    verdicts = []
    for label, measurement in levels:
        for objective in objectives:
            measured = objective.measure(measurement)
            verdicts.append(Verdict(objective, label, measured, objective.met_by(measured)))
    return verdicts
