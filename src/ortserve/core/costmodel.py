"""Online estimate of a batch's execution time as ``a + b * rows``."""

from __future__ import annotations

__all__ = ["BatchCostModel"]


class BatchCostModel:
    """Exponentially weighted least squares of run time against rows.

    Recent batches weigh most, so the fit follows thermal throttling, noisy neighbours and
    a provider fallback without a restart. Until two distinct batch sizes have been seen the
    time is taken as proportional to rows.

    Args:
        decay: weight kept by the past at each new observation (0 < decay < 1).
    """

    __slots__ = ("_a", "_b", "_decay", "_sx", "_sxx", "_sxy", "_sy", "_w")

    def __init__(self, decay: float = 0.98) -> None:
        self._decay = decay
        self._w = self._sx = self._sy = self._sxx = self._sxy = 0.0
        self._a = 0.0
        self._b = 0.0

    @property
    def fitted(self) -> bool:
        """Whether any batch has been observed."""
        return self._w > 0.0

    @property
    def coefficients(self) -> tuple[float, float]:
        """The current ``(a, b)`` in seconds and seconds per row."""
        return self._a, self._b

    def observe(self, rows: int, seconds: float) -> None:
        """Fold in one measured batch."""
        d = self._decay
        x = float(rows)
        self._w = self._w * d + 1.0
        self._sx = self._sx * d + x
        self._sy = self._sy * d + seconds
        self._sxx = self._sxx * d + x * x
        self._sxy = self._sxy * d + x * seconds
        self._refit()

    def _refit(self) -> None:
        w = self._w
        mean_x = self._sx / w
        mean_y = self._sy / w
        var_x = self._sxx / w - mean_x * mean_x
        if var_x > 1e-9 * max(1.0, mean_x * mean_x):
            b = (self._sxy / w - mean_x * mean_y) / var_x
            a = mean_y - b * mean_x
            if b >= 0.0 and a >= 0.0:
                self._a, self._b = a, b
                return
        # One batch size seen, or a fit that makes no physical sense: proportional model.
        self._a, self._b = 0.0, mean_y / max(mean_x, 1.0)

    def predict(self, rows: int) -> float:
        """Expected seconds to run a batch of ``rows`` rows (0.0 before any observation)."""
        return self._a + self._b * rows
