"""Output comparison of a primary answer and its shadow: per output tensor, max absolute and
relative difference, and for 2-D score outputs top-1 and top-k agreement."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ortserve.core.types import InferResponse

__all__ = ["MAX_COMPARED_ELEMENTS", "TOP_K", "OutputDivergence", "compare_arrays", "compare_responses"]

MAX_COMPARED_ELEMENTS = 1 << 20
"""Larger outputs are not compared (the comparison runs on the event loop)."""
TOP_K = 5
_TINY = 1e-12


@dataclass(frozen=True, slots=True)
class OutputDivergence:
    """How one output of the shadow differs from the primary's.

    ``max_abs``/``max_rel`` are ``inf`` when the shapes differ; ``top1``/``topk`` are the
    fraction of rows whose best class / top-k set agree (None unless a 2-D score output).
    """

    output: str
    max_abs: float
    max_rel: float
    top1: float | None = None
    topk: float | None = None
    rows: int = 0


def compare_arrays(
    output: str, primary: npt.NDArray[np.generic], shadow: npt.NDArray[np.generic]
) -> OutputDivergence:
    """Compare one output (numbers as float64; anything else element-wise equal or not)."""
    if primary.shape != shadow.shape:
        return OutputDivergence(output, float("inf"), float("inf"))
    if primary.size == 0:
        return OutputDivergence(output, 0.0, 0.0)
    numeric = primary.dtype.kind in "biuf" and shadow.dtype.kind in "biuf"
    if not numeric:
        differ = float(np.any(primary != shadow))
        return OutputDivergence(output, differ, differ)
    a = primary.astype(np.float64, copy=False)
    b = shadow.astype(np.float64, copy=False)
    diff = np.abs(a - b)
    if np.isnan(diff).any():
        return OutputDivergence(output, float("inf"), float("inf"))
    max_abs = float(diff.max())
    max_rel = float((diff / np.maximum(np.abs(a), _TINY)).max())
    if a.ndim != 2 or a.shape[1] < 2:
        return OutputDivergence(output, max_abs, max_rel)
    top1 = float(np.mean(np.argmax(a, axis=1) == np.argmax(b, axis=1)))
    k = min(TOP_K, a.shape[1] - 1)
    best_a = np.sort(np.argpartition(-a, k - 1, axis=1)[:, :k], axis=1)
    best_b = np.sort(np.argpartition(-b, k - 1, axis=1)[:, :k], axis=1)
    shared = [np.intersect1d(x, y, assume_unique=True).size for x, y in zip(best_a, best_b)]
    topk = float(np.mean(shared)) / k
    return OutputDivergence(output, max_abs, max_rel, top1, topk, a.shape[0])


def compare_responses(primary: InferResponse, shadow: InferResponse) -> list[OutputDivergence]:
    """Every output both answers hold, by name; outputs too large to compare are skipped."""
    theirs = {output.name: output for output in shadow.outputs}
    compared = []
    for ours in primary.outputs:
        other = theirs.get(ours.name)
        if other is None or ours.data.size > MAX_COMPARED_ELEMENTS:
            continue
        compared.append(compare_arrays(ours.name, ours.data, other.data))
    return compared
