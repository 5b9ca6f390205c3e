"""Shadow traffic: a sampled copy of a request also runs on the shadow version.

The client's answer is the primary's future, which this module never touches: the copy is
submitted beside it in the shadow version's lowest priority lane with a short deadline, and
both futures only get a done callback that compares the two answers once both are in. At most
``max_inflight`` copies run at once; a copy beyond it, or one the shadow's scheduler refuses
(queue full, overloaded), is dropped and counted.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from ortserve.core.model import Servable
from ortserve.core.types import InferRequest, InferResponse, RequestedOutput
from ortserve.errors import OrtServeError, Overloaded
from ortserve.routing.compare import compare_responses
from ortserve.routing.divergence import DivergenceBook

__all__ = ["ShadowLane"]


class ShadowLane:
    """Shadow copies of one model's requests, their drops, and their comparisons."""

    def __init__(self, book: DivergenceBook) -> None:
        self.book = book
        self.inflight = 0
        self.sent: Counter[str] = Counter()
        """Copies submitted, by shadow version."""
        self.compared: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        """Copies not run or not compared: full, refused, failed."""

    def offer(
        self,
        request: InferRequest,
        primary: asyncio.Future[InferResponse],
        shadow: Servable,
        priority: int,
        timeout_s: float,
        max_inflight: int,
    ) -> None:
        """Submit a copy of ``request`` to ``shadow`` unless the lane is full; never raises."""
        if self.inflight >= max_inflight:
            self.dropped["full"] += 1
            return
        outputs = None if request.outputs is None else [RequestedOutput(o.name) for o in request.outputs]
        copy = InferRequest(
            request.model_name,
            request.inputs,
            shadow.info.version,
            request.id,
            outputs,
            {},
            priority,
            timeout_s,
        )
        try:
            pending = shadow.submit(copy)
        except Overloaded:
            self.dropped["full"] += 1
            return
        except OrtServeError:
            self.dropped["refused"] += 1
            return
        self.inflight += 1
        self.sent[shadow.info.version] += 1
        _Pair(self, primary, pending)


class _Pair:
    """Waits for both answers (in either order), then compares them once."""

    __slots__ = ("_lane", "_primary", "_shadow", "_waiting")

    def __init__(
        self, lane: ShadowLane, primary: asyncio.Future[InferResponse], shadow: asyncio.Future[InferResponse]
    ) -> None:
        self._lane = lane
        self._primary = primary
        self._shadow = shadow
        self._waiting = 2
        primary.add_done_callback(self._done)
        shadow.add_done_callback(self._done)

    def _done(self, _: asyncio.Future[InferResponse]) -> None:
        self._waiting -= 1
        if not self._waiting:
            # After the callbacks already queued (the transport's answer): never ahead of it.
            self._primary.get_loop().call_soon(self._compare)

    def _compare(self) -> None:
        lane = self._lane
        lane.inflight -= 1
        if self._shadow.cancelled() or self._shadow.exception() is not None:
            lane.dropped["failed"] += 1
            return
        if self._primary.cancelled() or self._primary.exception() is not None:
            return  # nothing to compare against; the primary's failure is counted as its own
        ours, theirs = self._primary.result(), self._shadow.result()
        lane.book.add(ours.model_version, theirs.model_version, compare_responses(ours, theirs))
        lane.compared[theirs.model_version] += 1
