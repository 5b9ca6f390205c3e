"""What a model may be called: a folder name, and what model control and fallbacks accept."""

from __future__ import annotations

import re

__all__ = ["MODEL_NAME", "is_model_name"]

MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def is_model_name(name: str) -> bool:
    """A name a model folder may have (also what model control accepts)."""
    return MODEL_NAME.match(name) is not None
