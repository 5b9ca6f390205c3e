"""A batch of queued requests: each request, the run booked for them, their feeds joined
into one, and the run's outputs (or error) answered to each request and reported."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ortserve.core.clock import Clock, TimerHandle
from ortserve.core.job import Feeds, RunResult
from ortserve.core.observer import BatchRecord, SchedulerObserver
from ortserve.errors import InferenceError, InvalidInput, ModelNotReady, OrtServeError

__all__ = ["Pending", "Run", "assemble", "deliver", "fail", "report"]

logger = logging.getLogger(__name__)

Array = npt.NDArray[np.generic]


@dataclass(slots=True, eq=False)
class Pending:
    """One admitted request, from its queueing to its answer."""

    feeds: Feeds
    rows: int
    signature: tuple[tuple[int, ...], ...]
    arrival: float
    deadline: float | None
    future: asyncio.Future[list[Array]]
    lane: int
    timer: TimerHandle | None = None
    live: bool = True
    """Still counted in the queue (False once it left, for a batch or otherwise)."""
    tenant: str | None = None
    """Who sent it, when tenancy is on (see :mod:`ortserve.core.fairness`)."""


@dataclass(slots=True, eq=False)
class Run:
    """A batch booked on an instance, until it is settled."""

    batch: list[Pending]
    rows: int
    expected_end: float
    waits: tuple[float, ...]
    started: float = 0.0
    """When it was booked (its requests' waits end here)."""
    assemble_s: float = 0.0
    refused: Sequence[tuple[Pending, InvalidInput]] = ()
    """Requests the screen took out of the batch: answered with their error when it settles."""
    bulk: bool = False
    """Run in the executor's bulk lane (see :meth:`~ortserve.core.fairness.ActiveTenants.bulk`)."""


def assemble(batch: Sequence[Pending]) -> Feeds:
    """The batch's feeds joined along dim 0 (a batch of one is passed as is)."""
    if len(batch) == 1:
        return batch[0].feeds
    names = batch[0].feeds.keys()
    return {name: np.concatenate([p.feeds[name] for p in batch]) for name in names}


def report(
    run: Run, result: RunResult | None, error: BaseException | None, clock: Clock, observer: SchedulerObserver
) -> None:
    """Answer the run's requests with their rows (or its error) and record the batch."""
    split_s = 0.0
    if result is not None:
        split_start = clock.now()
        deliver(run.batch, result[0])
        split_s = clock.now() - split_start
    elif isinstance(error, asyncio.CancelledError):  # the executor was shut down under it
        fail(run.batch, ModelNotReady("the model was unloaded while this batch waited to run"))
    else:
        fail(run.batch, error or InferenceError("the batch produced no result"))
    run_s = result[1] if result is not None else 0.0
    observer.on_batch(
        BatchRecord(len(run.batch), run.rows, run.waits, run.assemble_s, run_s, split_s, result is None)
    )


def deliver(batch: Sequence[Pending], outputs: list[Array]) -> None:
    """Answer each request with its own rows of every output."""
    if len(batch) == 1:
        future = batch[0].future
        if not future.done():
            future.set_result(outputs)
        return
    start = 0
    for pending in batch:
        end = start + pending.rows
        if not pending.future.done():
            pending.future.set_result([out[start:end] for out in outputs])
        start = end


def fail(batch: Sequence[Pending], exc: BaseException) -> None:
    """Answer each request with the batch's error; anything unexpected is logged once and
    answered as an internal error, never passed to the client as it is."""
    if isinstance(exc, OrtServeError):
        error: OrtServeError = exc
    else:
        logger.error("batch of %d requests failed", len(batch), exc_info=exc)
        error = InferenceError("the model failed to run this batch (see server log)")
    for pending in batch:
        if not pending.future.done():
            pending.future.set_exception(error)
