"""Accumulated divergence of shadow pairs, per (primary, shadow, output): histograms for
Prometheus, a summary for the routing ``GET``, and the rollout's window."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ortserve.metrics import Histogram
from ortserve.routing.compare import OutputDivergence
from ortserve.routing.rollout import DivergenceWindow

__all__ = ["DIFF_BUCKETS", "DivergenceBook", "OutputStats"]

DIFF_BUCKETS = (1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.05, 0.1, 0.5, 1.0, 10.0)
"""Absolute and relative differences: from float rounding to a different answer."""
_RECENT = 1024
_WINDOW = 4096


@dataclass(slots=True)
class OutputStats:
    """One output of one (primary, shadow) pair of versions."""

    pairs: int = 0
    max_abs: Histogram = field(default_factory=lambda: Histogram(DIFF_BUCKETS))
    max_rel: Histogram = field(default_factory=lambda: Histogram(DIFF_BUCKETS))
    worst_abs: float = 0.0
    rows: int = 0
    top1_agreeing: float = 0.0
    topk_agreeing: float = 0.0
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=_RECENT))

    def add(self, found: OutputDivergence) -> None:
        self.pairs += 1
        self.max_abs.observe(found.max_abs)
        self.max_rel.observe(found.max_rel)
        self.worst_abs = max(self.worst_abs, found.max_abs)
        self.recent.append(found.max_abs)
        if found.top1 is not None and found.topk is not None:
            self.rows += found.rows
            self.top1_agreeing += found.top1 * found.rows
            self.topk_agreeing += found.topk * found.rows

    def summary(self) -> dict[str, float | int | None]:
        recent = np.fromiter(self.recent, float) if self.recent else None
        return {
            "pairs": self.pairs,
            "max_abs_diff": self.worst_abs,
            "p50_max_abs_diff": None if recent is None else float(np.percentile(recent, 50, method="higher")),
            "p99_max_abs_diff": None if recent is None else float(np.percentile(recent, 99, method="higher")),
            "top1_agreement": self.top1_agreeing / self.rows if self.rows else None,
            "topk_agreement": self.topk_agreeing / self.rows if self.rows else None,
        }


class DivergenceBook:
    """Every comparison of one model, keyed (primary version, shadow version, output)."""

    def __init__(self) -> None:
        self.outputs: dict[tuple[str, str, str], OutputStats] = {}
        self._window: dict[tuple[str, str], list[float]] = {}

    def add(self, primary: str, shadow: str, found: list[OutputDivergence]) -> float:
        """Record one pair's outputs; returns the pair's largest absolute difference."""
        worst = 0.0
        for divergence in found:
            key = (primary, shadow, divergence.output)
            stats = self.outputs.get(key)
            if stats is None:
                stats = self.outputs[key] = OutputStats()
            stats.add(divergence)
            worst = max(worst, divergence.max_abs)
        window = self._window.setdefault((primary, shadow), [])
        if len(window) < _WINDOW:
            window.append(worst)
        return worst

    def window(self, primary: str, shadow: str) -> DivergenceWindow:
        """Pairs since :meth:`reset_window`, with the p99 of their largest absolute difference."""
        values = self._window.get((primary, shadow), [])
        return DivergenceWindow(
            len(values), float(np.percentile(values, 99, method="higher")) if values else None
        )

    def reset_window(self) -> None:
        self._window.clear()

    def summary(self) -> list[dict[str, object]]:
        return [
            {"primary": p, "shadow": s, "output": o, **stats.summary()}
            for (p, s, o), stats in sorted(self.outputs.items())
        ]
