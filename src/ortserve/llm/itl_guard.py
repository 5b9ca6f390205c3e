"""Keeps the streams' measured inter-token gaps within the latency target, whatever the cost
models missed.

The engine plans each step from predictions: the decode it just measured, then prefill chunks
priced by a fitted mean (:class:`~ortserve.llm.prefill.ChunkCost`). A step planned to end at the
target overran it whenever its chunk ran longer than the mean, and a step also pays what no
model times (sampling a prompt's first token, copying keys and values to the prefix cache,
handing events to the event loop, a neighbour on a shared core). With the room filled to the
target on every step (prompts waiting, open loop) about half the steps overran: served ITL p99
67-69 ms against a 61 ms target (issue 35).

:class:`ItlGuard` watches the gap a running stream sees (from one step's events to the next
step's) and scales the target the plan aims at so that a small share of gaps exceed the real
target: each gap over it takes ``down`` off the scale, each gap within adds back the amount
that balances at ``over`` of the gaps (a quantile tracker). It follows the machine: noise that
goes away lets the scale climb back to 1. A gap counts as beyond once it passes the target less
``margin``: the engine sees when it hands a step's events out, a client when the event loop has
written them, a few milliseconds later and not always by the same amount (served, a guard on the
whole target gave ITL p99 63.8 ms against 62.5 at 1.3x capacity).
"""

from __future__ import annotations

import math

__all__ = ["ItlGuard"]


class ItlGuard:
    """The share of the latency target a step's plan may fill.

    Args:
        over: the share of gaps allowed beyond the target (the tracked quantile is 1 - over):
            the target bounds p99. At 0.004 the scale sat at 0.46-0.55 served with ITL p99 at
            0.74-0.9 of the target, and the prefill it left (one 32-token chunk a step) fed
            14-16 rows under overload; at 0.01 it sat at 0.8-0.9 and fed 24-26.
        down: the relative cut of the scale after a gap beyond the target.
        floor: the lowest scale (a plan never aims below this share of the target).
        margin: the share of the target kept for what happens after the engine's step (the
            delivery to the client).
    """

    def __init__(
        self, over: float = 0.01, down: float = 0.03, floor: float = 0.4, margin: float = 0.05
    ) -> None:
        self.over = over
        self.floor = floor
        self.margin = margin
        self._down = math.log1p(-down)
        # Balance: over · log(1 - down) + (1 - over) · up = 0, so gaps beyond the target settle
        # at ``over`` of all gaps.
        self._up = -self._down * over / (1.0 - over)
        self.scale = 1.0
        self.gaps = 0
        self.beyond = 0
        self.past_target = 0
        """Gaps observed, how many passed the target less the margin, and the target itself
        (exported: the engine's own view, to tell its tail from the delivery's)."""

    def observe(self, gap_s: float, target_s: float) -> None:
        """A running stream's gap between two tokens (one step's events to the next's)."""
        self.gaps += 1
        self.past_target += gap_s > target_s
        if gap_s > target_s * (1.0 - self.margin):
            self.beyond += 1
            self.scale = max(self.floor, self.scale * math.exp(self._down))
        else:
            self.scale = min(1.0, self.scale * math.exp(self._up))
