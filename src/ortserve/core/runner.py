"""Runs batches on an ONNX Runtime session in a fixed set of worker threads."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from ortserve.core.binding import BindingRun, DeviceSpec, bindable, binding_device
from ortserve.core.guards import ChainedSession
from ortserve.core.job import BatchJob, RunResult
from ortserve.core.ortvalues import OrtValueRun, needs_ort_values

__all__ = ["BULK_NICE", "OrtRunner"]

BULK_NICE = 19
"""The nice value of the bulk lane's workers (CFS weight 15 against 1,024 at nice 0): a
flooding tenant's batch on such a worker takes ~1.5% of a core that a quiet tenant's run (or
the event loop) also wants, and all of an idle one. Fixed per thread: a thread may raise its
own nice without privilege but not lower it again, so a lane is a set of threads, not a
setting switched per batch. Nice 10 (weight 110) was measured too and left the event loop
waiting more (benchmarks/RESULTS.md, "bulk lane"). A bulk worker preempted while it holds the
GIL or the scheduler's lock holds up the threads waiting for them until it runs again: at once
on a core the server has to itself (they sleep, it is the one thread runnable), after the other
processes' turns on a core shared with busy ones."""

logger = logging.getLogger(__name__)

Array = npt.NDArray[np.generic]


class OrtRunner:
    """``instances`` concurrent ``session.run`` calls on one shared session.

    ONNX Runtime sessions are safe to run from several threads at once and ``run`` releases
    the GIL, so one session serves every instance without copying the weights N times.

    The workers are plain threads fed by a queue (measured against ``loop.run_in_executor``
    this skips a ``concurrent.futures.Future`` and the future chaining per batch, a visible
    share of a small model's latency at concurrency 1). A worker that finishes a batch takes
    the next one from the scheduler itself (:meth:`BatchJob.complete`): it never waits for
    the event loop while work is queued.

    A job the scheduler marks ``inline`` (its size class runs under :attr:`inline_below_s`,
    see :class:`~ortserve.core.inlining.InlineGate`; no other batch running) runs on the
    calling (event loop) thread: handing it to a worker and back costs two thread switches, a
    futex and a wake-up of the loop, more than such a run.

    With two or more instances the workers are two lanes of ``instances`` threads each: the
    batches :class:`BatchJob` marks ``bulk`` (a flooding tenant's, beside a quiet tenant
    active: :meth:`~ortserve.core.fairness.ActiveTenants.bulk`) run on threads at
    :data:`BULK_NICE`, the others at the process's nice. The lane covers the thread calling
    ``run``, i.e. the whole run with one intra-op thread; ONNX Runtime's own intra-op threads
    are the session's, shared by both lanes. The bulk threads start with the first bulk batch.

    A graph with bfloat16 inputs or outputs runs through OrtValues instead (see
    :class:`~ortserve.core.ortvalues.OrtValueRun`); a session whose first provider keeps
    tensors on a device (CUDA, TensorRT) runs through an IOBinding over reusable device
    buffers (:class:`~ortserve.core.binding.BindingRun`); every other graph keeps
    ``session.run``, measured as fast as a bound run on the CPU (so does a graph with string
    tensors, which an IOBinding cannot carry).

    Args:
        session: the built session, or the fallback chain standing in for it.
        instances: how many batches may run at the same time.
        name: used to name the worker threads.
        bind_on: run through an IOBinding on this device whatever the provider (tests of the
            device path on the CPU); None decides from the session's first provider.
        screened: the scheduler screens this version's inputs (input sandbox): a lone request
            is then never run straight on its CUDA windows, whose device memory the client
            could change after the screen read the decoded copy.
    """

    def __init__(
        self,
        session: ort.InferenceSession | ChainedSession,
        instances: int,
        name: str,
        bind_on: DeviceSpec | None = None,
        screened: bool = False,
    ) -> None:
        self._session = session
        self._instances = instances
        self._jobs: queue.SimpleQueue[BatchJob | None] = queue.SimpleQueue()
        self.output_names = [o.name for o in session.get_outputs()]
        self._ort_values: OrtValueRun | BindingRun | None = None
        if isinstance(session, ort.InferenceSession):
            if needs_ort_values(session):
                self._ort_values = OrtValueRun(session, self.output_names)
            elif bindable(session) and (device := bind_on or binding_device(session)) is not None:
                self._ort_values = BindingRun(
                    session, self.output_names, device, label=name, windows=not screened
                )
        self.inline_below_s = 100e-6
        self._name = name
        self._bulk_jobs: queue.SimpleQueue[BatchJob | None] | None = None
        self._lanes_lock = threading.Lock()
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._start_lane(self._jobs, 0, name)

    @property
    def instances(self) -> int:
        return self._instances

    @property
    def providers(self) -> list[str]:
        """The execution providers the session actually uses, in priority order."""
        return list(self._session.get_providers())

    def run_blocking(self, feeds: dict[str, Array]) -> RunResult:
        """Run on the calling thread (warm-up, worker threads); returns outputs and seconds."""
        start = time.perf_counter()
        if self._ort_values is None:
            outputs = self._session.run(self.output_names, feeds)
        else:
            outputs = self._ort_values(feeds)
        return outputs, time.perf_counter() - start

    def execute(self, job: BatchJob) -> None:
        """Run inline when the scheduler says so (see the class), else queue for the workers."""
        if job.inline:
            try:
                result = self.run_blocking(job.feeds)
            except Exception as exc:  # the scheduler logs and maps it, as for a worker's
                job.complete(None, exc, chain=False)
            else:
                job.complete(result, None, chain=False)
            return
        self._lane(job.bulk).put(job)

    def _lane(self, bulk: bool) -> queue.SimpleQueue[BatchJob | None]:
        """The queue of the workers of ``bulk``'s lane; the bulk workers start on first use."""
        if not bulk or self._instances < 2:
            return self._jobs
        jobs = self._bulk_jobs
        if jobs is not None:
            return jobs
        with self._lanes_lock:  # the loop and a worker's chain may both get here first
            if self._bulk_jobs is None:
                jobs = queue.SimpleQueue()
                self._start_lane(jobs, BULK_NICE, f"{self._name}-bulk")
                self._bulk_jobs = jobs
            return self._bulk_jobs

    def _start_lane(self, jobs: queue.SimpleQueue[BatchJob | None], nice: int, label: str) -> None:
        """``instances`` workers taking ``jobs``, each at ``nice``."""
        for index in range(self._instances):
            thread = threading.Thread(
                target=self._work, args=(jobs, nice), name=f"ort-{label}-{index}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def _work(self, jobs: queue.SimpleQueue[BatchJob | None], nice: int) -> None:
        _prefer_batch_scheduling()
        if nice:
            _lower_weight(nice)
        bulk = jobs is not self._jobs
        while (job := jobs.get()) is not None:
            self._run_chain(job, bulk)

    def _run_chain(self, job: BatchJob, bulk: bool) -> None:
        """Run ``job`` and then each batch its completion hands back, without the loop; one
        of the other lane goes to that lane's workers."""
        following: BatchJob | None = job
        while following is not None:
            if following.bulk != bulk and self._instances > 1 and not self._closed:
                self._lane(following.bulk).put(following)
                return
            current = following
            try:
                result = self.run_blocking(current.feeds)
            except BaseException as exc:  # handed to the loop; the scheduler logs and maps it
                following = self._complete(current, None, exc)
            else:
                following = self._complete(current, result, None)

    @staticmethod
    def _complete(job: BatchJob, result: RunResult | None, error: BaseException | None) -> BatchJob | None:
        try:
            return job.complete(result, error, chain=True)
        except Exception:  # a bug in the scheduler must not kill the worker thread
            logger.exception("completing a batch failed")
            return None

    def close(self) -> None:
        """Let the workers finish what is queued, then stop them."""
        with self._lanes_lock:
            self._closed = True  # a chain now runs what it gets on its own thread
            for _ in range(self._instances):
                self._jobs.put(None)
                if self._bulk_jobs is not None:
                    self._bulk_jobs.put(None)

    def join(self, timeout_s: float) -> None:
        """Wait (blocking) for the workers stopped by :meth:`close` to exit."""
        for thread in self._threads:
            thread.join(timeout_s)


def _prefer_batch_scheduling() -> None:
    """Mark this worker thread SCHED_BATCH (Linux): it then never preempts the event loop on
    wake-up, and the loop's short callbacks interrupt a running batch less often. Measured
    side by side with the server and its workers on one core: +7-11% requests/s on the heavy
    demo MLP at concurrency 64, no change at concurrency 1."""
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None:
        return
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, policy, os.sched_param(0))


def _lower_weight(nice: int) -> None:
    """Raise this thread's nice to ``nice`` (Linux: ``setpriority`` on the thread's id sets that
    thread only); where it cannot (another system, a sandbox), the lane runs at full weight."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
