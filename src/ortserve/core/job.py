"""The hand-over between a scheduler and the executor that runs its batches.

The executor's threads do not wait for the event loop between batches: finishing a batch
returns the next one (:meth:`BatchJob.complete`), taken from the scheduler's queue on the
worker's own thread. A loop busy reading sockets then delays only the answers, never the
model (issue 10: a runner idle for seconds beside 1,024 queued requests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["BatchExecutor", "BatchJob", "Feeds", "RunResult"]

Array = npt.NDArray[np.generic]
Feeds = dict[str, Array]
RunResult = tuple[list[Array], float]
"""The outputs of a run and the seconds it took."""

Completion = Callable[["RunResult | None", "BaseException | None", bool], "BatchJob | None"]


@dataclass(slots=True, eq=False)
class BatchJob:
    """One assembled batch.

    Args:
        feeds: input name -> the batch's array.
        expected_s: predicted run time (inf when unknown).
        inline: run it on the calling (event loop) thread: it is predicted shorter than the
            hand-over to a worker and back, and no other batch is running.
        on_complete: the scheduler's completion (see :meth:`complete`).
        bulk: run it on a worker of lower CPU weight (a flooding tenant's batch beside a
            quiet tenant's: :meth:`~ortserve.core.fairness.ActiveTenants.bulk`).
    """

    feeds: Feeds
    expected_s: float
    inline: bool
    on_complete: Completion
    bulk: bool = False

    def complete(self, result: RunResult | None, error: BaseException | None, chain: bool) -> BatchJob | None:
        """Report the run's result (or error), from the thread that ran it.

        Args:
            result: outputs and seconds, or None when the run failed.
            error: why it failed, or None.
            chain: the caller is a worker that will run the returned job at once; False for
                an inline run, whose next batch the loop dispatches itself.

        Returns:
            The next batch for this worker when ``chain`` and one is ready, else None.
        """
        return self.on_complete(result, error, chain)


class BatchExecutor(Protocol):
    """Runs the batches of one scheduler on ``instances`` workers."""

    @property
    def instances(self) -> int: ...

    inline_below_s: float
    """Batches expected to be shorter than this may run inline (0: never)."""

    def execute(self, job: BatchJob) -> None:
        """Run ``job``: inline when ``job.inline``, else on a worker, which keeps running the
        jobs that :meth:`BatchJob.complete` returns. Called on the event loop's thread."""
        ...
