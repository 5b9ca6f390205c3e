"""The most divergent shadow pairs, written in the capture format so ``ortserve replay`` can
send them again (to either version, to reproduce the difference).

A request is written when its largest output difference enters the top ``top`` seen so far:
at most ``top`` records for a steady stream, a few more as the worst cases are replaced.
"""

from __future__ import annotations

import heapq
import time

from ortserve.capture import Capture
from ortserve.core.types import InferInput, InferRequest

__all__ = ["DivergentPairs"]


class DivergentPairs:
    """Keeps the ``top`` largest divergences and captures each request entering them."""

    def __init__(self, capture: Capture, top: int) -> None:
        self.capture = capture
        self.top = top
        self._worst: list[float] = []
        self.written = 0

    def offer(self, worst: float, model: str, inputs: list[InferInput], primary: str, shadow: str) -> None:
        if len(self._worst) >= self.top and not worst > self._worst[0]:
            return
        if len(self._worst) >= self.top:
            heapq.heapreplace(self._worst, worst)
        else:
            heapq.heappush(self._worst, worst)
        parameters: dict[str, bool | int | float | str] = {
            "shadow_max_abs_diff": worst if worst != float("inf") else -1.0,
            "shadow_primary_version": primary,
            "shadow_version": shadow,
        }
        request = InferRequest(model, inputs, None, None, None, parameters)
        now = (time.time(), time.monotonic())
        self.capture.offer_grpc(request, now, 200)
        self.written += 1
