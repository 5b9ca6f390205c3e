"""Moved to :mod:`ortserve.config.model` (the per-model schemas, a package importing no feature
package); kept so that code written against the old path still imports."""

from __future__ import annotations

from ortserve.config.model import (
    CONFIG_FILE,
    BatchingConfig,
    LatestPolicy,
    ModelConfig,
    ProviderConfig,
    SpecificPolicy,
    VersionPolicy,
    load_model_config,
)

__all__ = [
    "CONFIG_FILE",
    "BatchingConfig",
    "LatestPolicy",
    "ModelConfig",
    "ProviderConfig",
    "SpecificPolicy",
    "VersionPolicy",
    "load_model_config",
]
