"""Runs batches on an ONNX Runtime session in a bounded pool of worker threads."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

__all__ = ["OrtRunner"]

Array = npt.NDArray[np.generic]


class OrtRunner:
    """``instances`` concurrent ``session.run`` calls on one shared session.

    ONNX Runtime sessions are safe to run from several threads at once and ``run`` releases
    the GIL, so one session serves every instance without copying the weights N times.

    Args:
        session: the built session.
        instances: how many batches may run at the same time.
        loop: the loop whose futures ``execute`` returns.
        name: used to name the worker threads.
    """

    def __init__(
        self, session: ort.InferenceSession, instances: int, loop: asyncio.AbstractEventLoop, name: str
    ) -> None:
        self._session = session
        self._instances = instances
        self._loop = loop
        self._pool = ThreadPoolExecutor(max_workers=instances, thread_name_prefix=f"ort-{name}")
        self.output_names = [o.name for o in session.get_outputs()]

    @property
    def instances(self) -> int:
        return self._instances

    @property
    def providers(self) -> list[str]:
        """The execution providers the session actually uses, in priority order."""
        return list(self._session.get_providers())

    def run_blocking(self, feeds: dict[str, Array]) -> tuple[list[Array], float]:
        """Run on the calling thread (warm-up, worker threads); returns outputs and seconds."""
        start = time.perf_counter()
        outputs = self._session.run(self.output_names, feeds)
        return outputs, time.perf_counter() - start

    def execute(self, feeds: dict[str, Array]) -> asyncio.Future[tuple[list[Array], float]]:
        """Start a run in the pool without blocking the event loop."""
        return self._loop.run_in_executor(self._pool, self.run_blocking, feeds)

    def close(self) -> None:
        """Stop the worker threads once running batches end."""
        self._pool.shutdown(wait=False, cancel_futures=True)
