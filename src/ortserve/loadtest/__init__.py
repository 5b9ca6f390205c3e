"""Load testing: the generator behind ``ortserve bench`` / ``replay`` and the server's traffic capture."""

from __future__ import annotations

from ortserve.loadtest.generator import LoadLevel
from ortserve.loadtest.histogram import Histogram
from ortserve.loadtest.measurement import Measurement
from ortserve.loadtest.slo import Objective, parse_objective

__all__ = ["Histogram", "LoadLevel", "Measurement", "Objective", "parse_objective"]
