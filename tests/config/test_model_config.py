"""A model folder's config.yaml read below the repository (a fallback model's) is bounded too."""

from __future__ import annotations

from pathlib import Path

import pytest

from ortserve.config.bounded import DEFAULT_LIMITS
from ortserve.config.model import load_model_config
from ortserve.errors import ConfigError


def test_an_oversized_or_nested_config_is_refused_before_it_is_built(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("x: " + "a" * (DEFAULT_LIMITS.max_bytes + 1), encoding="utf-8")
    with pytest.raises(ConfigError, match="larger than"):
        load_model_config(tmp_path)
    (tmp_path / "config.yaml").write_text("a: " + "[" * 5000 + "]" * 5000, encoding="utf-8")
    with pytest.raises(ConfigError):
        load_model_config(tmp_path)


def test_a_valid_config_reads_and_a_bad_field_is_named(tmp_path: Path) -> None:
    assert load_model_config(tmp_path).batching.max_batch_size is None  # no file: the defaults
    (tmp_path / "config.yaml").write_text("batching:\n  max_batch_size: 8\n", encoding="utf-8")
    assert load_model_config(tmp_path).batching.max_batch_size == 8
    (tmp_path / "config.yaml").write_text("batching:\n  max_batch_size: -1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="field batching.max_batch_size"):
        load_model_config(tmp_path)
