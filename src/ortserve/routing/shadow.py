"""Shadow traffic: a sampled copy of a request also runs on the shadow version.

The client's answer is the primary's future, which this module never touches: the copy is
submitted beside it in the shadow version's lowest priority lane with its own deadline, and
the primary's future only gets a done callback that compares the two answers once both are in
(scheduled after the callbacks already queued, so never ahead of the transport's answer).

Copies are gathered into one shadow request of up to ``batch`` rows (or until ``max_delay``
passes): the shadow's scheduler runs an idle model at once, so copies arriving one by one
would each run as a batch of one, and for a model whose cost is its weights (a large MLP) a
batch of one costs nearly what a full batch does. At most ``max_inflight`` copies are held or
running; a copy beyond it, or one the shadow's scheduler refuses (queue full, overloaded), is
dropped and counted.
"""

from __future__ import annotations

import asyncio
import functools
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ortserve.core.model import Servable
from ortserve.core.types import InferInput, InferOutput, InferRequest, InferResponse
from ortserve.errors import OrtServeError, Overloaded
from ortserve.routing.compare import compare_responses
from ortserve.routing.divergence import DivergenceBook
from ortserve.routing.keeper import DivergentPairs

__all__ = ["ShadowLane", "ShadowTarget"]


@dataclass(frozen=True, slots=True)
class ShadowTarget:
    """Where and how copies run."""

    served: Servable
    priority: int
    timeout_s: float
    max_inflight: int
    batch: int = 1
    max_delay_s: float = 0.05


@dataclass(slots=True)
class _Copy:
    inputs: list[InferInput]
    rows: int
    primary: asyncio.Future[InferResponse]


@dataclass(slots=True)
class _Gathering:
    target: ShadowTarget
    copies: list[_Copy] = field(default_factory=list)
    rows: int = 0
    timer: asyncio.TimerHandle | None = None


class ShadowLane:
    """Shadow copies of one model's requests, their drops, and their comparisons."""

    def __init__(self, book: DivergenceBook) -> None:
        self.book = book
        self.inflight = 0
        """Copies gathered or running."""
        self.sent: Counter[str] = Counter()
        """Copies submitted, by shadow version."""
        self.compared: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        """Copies not run or not compared: full, refused, failed."""
        self._gathering: dict[str, _Gathering] = {}
        self.keeper: DivergentPairs | None = None
        """Captures the most divergent requests (``shadow.capture_dir``)."""

    def offer(
        self, request: InferRequest, primary: asyncio.Future[InferResponse], target: ShadowTarget
    ) -> None:
        """Hold a copy of ``request`` for ``target`` unless the lane is full; never raises."""
        if self.inflight >= target.max_inflight:
            self.dropped["full"] += 1
            return
        version = target.served.info.version
        rows = request.inputs[0].shape[0] if request.inputs and request.inputs[0].shape else 0
        limit = target.served.info.max_batch_size
        gathering = self._gathering.get(version)
        if gathering is not None and (
            gathering.target.served is not target.served or not _joinable(gathering, request, rows, limit)
        ):
            self._flush(version)
            gathering = None
        if gathering is None:
            gathering = self._gathering[version] = _Gathering(target)
        gathering.copies.append(_Copy(request.inputs, rows, primary))
        gathering.rows += rows
        self.inflight += 1
        if target.batch <= 1 or limit == 0 or gathering.rows >= min(target.batch, limit):
            self._flush(version)
        elif gathering.timer is None:
            gathering.timer = primary.get_loop().call_later(
                target.max_delay_s, functools.partial(self._flush, version)
            )

    def _flush(self, version: str) -> None:
        gathering = self._gathering.pop(version, None)
        if gathering is None:
            return
        if gathering.timer is not None:
            gathering.timer.cancel()
        target, copies = gathering.target, gathering.copies
        inputs = copies[0].inputs if len(copies) == 1 else _joined(copies)
        request = InferRequest(
            target.served.info.name, inputs, version, None, None, {}, target.priority, target.timeout_s
        )
        try:
            pending = target.served.submit(request)
        except OrtServeError as error:
            self.inflight -= len(copies)
            self.dropped["full" if isinstance(error, Overloaded) else "refused"] += len(copies)
            return
        self.sent[version] += len(copies)
        pending.add_done_callback(functools.partial(self._answered, copies))

    def _answered(self, copies: list[_Copy], pending: asyncio.Future[InferResponse]) -> None:
        self.inflight -= len(copies)
        if pending.cancelled() or pending.exception() is not None:
            self.dropped["failed"] += len(copies)
            return
        response = pending.result()
        start = 0
        for copy in copies:
            part = _rows(response, start, copy.rows) if len(copies) > 1 else response
            start += copy.rows
            if copy.primary.done():
                copy.primary.get_loop().call_soon(self._compare, copy, part)
            else:
                copy.primary.add_done_callback(functools.partial(self._primary_done, copy, part))

    def _primary_done(
        self, copy: _Copy, shadow: InferResponse, primary: asyncio.Future[InferResponse]
    ) -> None:
        # After the callbacks already queued (the transport's answer): never ahead of it.
        primary.get_loop().call_soon(self._compare, copy, shadow)

    def _compare(self, copy: _Copy, shadow: InferResponse) -> None:
        primary = copy.primary
        if primary.cancelled() or primary.exception() is not None:
            return  # nothing to compare against; the primary's failure is counted as its own
        ours = primary.result()
        worst = self.book.add(ours.model_version, shadow.model_version, compare_responses(ours, shadow))
        self.compared[shadow.model_version] += 1
        if self.keeper is not None:
            self.keeper.offer(worst, ours.model_name, copy.inputs, ours.model_version, shadow.model_version)


def _joinable(gathering: _Gathering, request: InferRequest, rows: int, limit: int) -> bool:
    """Whether ``request`` can share the gathered shadow request: same inputs, room for its rows."""
    first = gathering.copies[0].inputs
    if rows == 0 or gathering.rows + rows > limit > 0:
        return False
    return [(t.name, t.datatype, t.shape[1:]) for t in first] == [
        (t.name, t.datatype, t.shape[1:]) for t in request.inputs
    ]


def _joined(copies: list[_Copy]) -> list[InferInput]:
    joined = []
    for index, tensor in enumerate(copies[0].inputs):
        data = np.concatenate([copy.inputs[index].data for copy in copies])
        joined.append(InferInput(tensor.name, tensor.datatype, data.shape, data))
    return joined


def _rows(response: InferResponse, start: int, rows: int) -> InferResponse:
    outputs = []
    for output in response.outputs:
        data = output.data[start : start + rows]
        outputs.append(InferOutput(output.name, output.datatype, data.shape, data))
    return InferResponse(response.model_name, response.model_version, outputs)
