"""Moved to :mod:`ortserve.config.routing` (the per-model schemas, a package importing no feature
package); kept so that code written against the old path still imports."""

from __future__ import annotations

from ortserve.config.routing import (
    Duration,
    GuardsConfig,
    HeaderName,
    OverrideConfig,
    ParameterName,
    RetireConfig,
    RolloutConfig,
    RoutingConfig,
    ShadowConfig,
    StickyConfig,
    Version,
    parse_duration,
)

__all__ = [
    "Duration",
    "GuardsConfig",
    "HeaderName",
    "OverrideConfig",
    "ParameterName",
    "RetireConfig",
    "RolloutConfig",
    "RoutingConfig",
    "ShadowConfig",
    "StickyConfig",
    "Version",
    "parse_duration",
]
