"""Moved to :mod:`ortserve.config.llm` (the per-model schemas, a package importing no feature
package); kept so that code written against the old path still imports."""

from __future__ import annotations

from ortserve.config.llm import LlmConfig

__all__ = ["LlmConfig"]
