"""The degraded mark carried by a fallback level's output arrays through the scheduler.

The scheduler splits a batch's outputs into each request's rows by slicing; it neither knows
nor should know which level answered (docs/architecture.md: "Fallback inside the served
version"). A NumPy subclass survives that slicing (``__array_finalize__`` copies the mark to
every view), so the served version reads the mark off its rows and strips it, with no change
to the scheduler and one type check per answer when nothing is degraded.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ortserve.core.types import Degraded

__all__ = ["MarkedArray", "mark", "unmark"]

Array = npt.NDArray[np.generic]


class MarkedArray(np.ndarray[Any, np.dtype[Any]]):
    """An output view that remembers the degraded answer it belongs to."""

    degraded: Degraded | None = None

    def __array_finalize__(self, obj: object) -> None:
        self.degraded = getattr(obj, "degraded", None)


def mark(outputs: list[Array], degraded: Degraded) -> list[Array]:
    """Views of ``outputs`` carrying ``degraded`` (no copy)."""
    marked: list[Array] = []
    for output in outputs:
        view = output.view(MarkedArray)
        view.degraded = degraded
        marked.append(view)
    return marked


def unmark(arrays: list[Array]) -> tuple[list[Array], Degraded | None]:
    """Plain arrays and the mark, if the answer is degraded; the same list when it is not."""
    if not arrays or type(arrays[0]) is not MarkedArray:
        return arrays, None
    degraded = arrays[0].degraded
    return [a.view(np.ndarray) for a in arrays], degraded
