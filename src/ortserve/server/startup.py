"""The one startup error, in a module light enough for the supervisor of ``--workers`` to import
without ONNX Runtime (each process it does not need costs every worker's memory nothing, but
the supervisor's own)."""

from __future__ import annotations

__all__ = ["StartupError"]


class StartupError(Exception):
    """The server cannot start for a reason the operator fixes (not a bug: no traceback)."""
