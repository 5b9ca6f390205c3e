"""Moved to :mod:`ortserve.core.marks`: the degraded mark is the core's (the served version
strips it); kept so that code written against the old path still imports."""

from __future__ import annotations

from ortserve.core.marks import MarkedArray, mark, unmark

__all__ = ["MarkedArray", "mark", "unmark"]
