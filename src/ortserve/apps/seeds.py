"""Writing the seed applications (trained models, artefacts, configs) into a model repository."""

from __future__ import annotations

from pathlib import Path

from ortserve.apps.dispatch.training import train_dispatch
from ortserve.apps.hotword.training import train_hotword

__all__ = ["SEED_APPS", "write_seed_apps"]

_HOTWORD_CONFIG = """\
# Search hotwords: POST /v1/predict, or OIP model "hotword.pipeline" (BYTES JSON in and out).
pipeline: hotword
batching:
  max_batch_size: 64
  max_queue_delay_ms: 1.0
"""

_DISPATCH_CONFIG = """\
# Logistics dispatch: POST /v1/route, or OIP model "dispatch.pipeline" (BYTES JSON in and out).
# One request scores all its order x courier pairs; calls beyond max_batch_size are chunked.
pipeline: dispatch
batching:
  max_batch_size: 4096
  max_queue_delay_ms: 1.0
"""

SEED_APPS = {"hotword": (train_hotword, _HOTWORD_CONFIG), "dispatch": (train_dispatch, _DISPATCH_CONFIG)}


def write_seed_apps(root: Path) -> list[str]:
    """Train each seed app's model (deterministic, a few seconds) into ``root``; returns names."""
    for name, (train, config) in SEED_APPS.items():
        train(root / name / "1")
        (root / name / "config.yaml").write_text(config, encoding="utf-8")
    return list(SEED_APPS)
