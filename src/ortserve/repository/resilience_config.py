"""Moved to :mod:`ortserve.config.resilience` (the per-model schemas, a package importing no feature
package); kept so that code written against the old path still imports."""

from __future__ import annotations

from ortserve.config.resilience import (
    LEVEL_NAMES,
    BreakerConfig,
    DefaultAnswerConfig,
    FallbackConfig,
    FaultConfig,
    InputConstraint,
    StaticOutput,
)

__all__ = [
    "LEVEL_NAMES",
    "BreakerConfig",
    "DefaultAnswerConfig",
    "FallbackConfig",
    "FaultConfig",
    "InputConstraint",
    "StaticOutput",
]
