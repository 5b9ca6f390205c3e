"""Runs load levels in this process or across generator processes, with progress and Ctrl-C."""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ProcessPoolExecutor, wait
from multiprocessing.sharedctypes import SynchronizedArray
from multiprocessing.synchronize import Event as MpEvent
from typing import Any, TextIO, TypeVar

from ortserve.loadtest.generator import Drive, LoadLevel, drive_level
from ortserve.loadtest.measurement import Measurement
from ortserve.loadtest.transports import Target

__all__ = ["LoadRunner", "Progress", "StopOnSigint", "run_loop"]

_child: dict[str, Any] = {}
T = TypeVar("T")


def run_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on uvloop where available (a faster event loop), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


class Progress:
    """A one-line progress display on stderr, redrawn at most every 0.2 s."""

    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream

    def show(self, level: LoadLevel, started: float, done: int, label: str | None = None) -> None:
        """Redraw: ``label`` (default: the level's), progress, replies so far and their rate."""
        if self._stream is None:
            return
        elapsed = time.perf_counter() - started
        total = (level.duration_s or 0.0) + level.warmup_s
        where = f"{elapsed:5.1f}/{total:.1f} s" if level.requests is None else f"{done}/{level.requests} req"
        rate = done / elapsed if elapsed > 0 else 0.0
        self._stream.write(f"\r{label or level.label}: {where}, {done} replies, {rate:,.0f}/s ")
        self._stream.flush()

    def end(self) -> None:
        if self._stream is not None:
            self._stream.write("\n")
            self._stream.flush()


class LoadRunner:
    """Runs levels against one target on ``processes`` generator processes.

    Ctrl-C (SIGINT) stops the level in progress; what was measured so far is returned and
    :attr:`interrupted` turns true, so the caller can report it and stop sweeping.

    Args:
        target: the server.
        wires: pre-built request bytes, used in turn.
        processes: 1 runs in this process; more spawn that many generator processes.
        progress: where to draw progress (None: nowhere).
    """

    def __init__(
        self, target: Target, wires: list[bytes], processes: int = 1, progress: TextIO | None = None
    ) -> None:
        self._target = target
        self._wires = wires
        self._processes = processes
        self._progress = Progress(progress)
        self.interrupted = False
        self._pool: ProcessPoolExecutor | None = None
        self._counts: SynchronizedArray[int] | None = None
        self._stop: MpEvent | None = None

    def __enter__(self) -> LoadRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, level: LoadLevel) -> Measurement:
        """Run one level to its end (or Ctrl-C) and return the merged measurement."""
        if self._processes == 1:
            return self._run_here(level)
        return self._run_spread(level)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _run_here(self, level: LoadLevel) -> Measurement:
        started = time.perf_counter()

        def tick(drive: Drive) -> None:
            self._progress.show(level, started, drive.done)

        async def main() -> Measurement:
            stop = StopOnSigint()
            try:
                return await drive_level(self._target, self._wires, level, stop.wrap(tick))
            finally:
                stop.restore()
                self.interrupted = self.interrupted or stop.fired

        measurement = run_loop(main())
        self._progress.end()
        return measurement

    def _ensure_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            context = multiprocessing.get_context("spawn")
            self._counts = context.Array("q", self._processes, lock=False)
            self._stop = context.Event()
            self._pool = ProcessPoolExecutor(
                self._processes,
                mp_context=context,
                initializer=_init_child,
                initargs=(self._target, self._wires, self._counts, self._stop),
            )
        return self._pool

    def _run_spread(self, level: LoadLevel) -> Measurement:
        pool = self._ensure_pool()
        assert self._counts is not None and self._stop is not None
        for index in range(self._processes):
            self._counts[index] = 0
        shares = [(i, s) for i in range(self._processes) if (s := level.share(i, self._processes))]
        futures = [pool.submit(_child_level, share, index) for index, share in shares]
        self._wait(level, futures)
        merged = Measurement()
        for future in futures:
            merged.merge(Measurement.from_dict(future.result()))
        return merged

    def _wait(self, level: LoadLevel, futures: list[Future[dict[str, object]]]) -> None:
        assert self._counts is not None and self._stop is not None
        started = time.perf_counter()
        pending = set(futures)
        while pending:
            try:
                _, pending = wait(pending, timeout=0.2)
            except KeyboardInterrupt:
                self.interrupted = True
                self._stop.set()
            self._progress.show(level, started, sum(self._counts[:]))
        self._progress.end()


class StopOnSigint:
    """Turns SIGINT into a stop of the running drive (checked on each progress tick)."""

    def __init__(self) -> None:
        self.fired = False
        self._previous = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, self._fire)

    def _fire(self, signum: int, frame: object) -> None:
        self.fired = True

    def wrap(self, tick: Callable[[Drive], None]) -> Callable[[Drive], None]:
        def on_tick(drive: Drive) -> None:
            if self.fired:
                drive.stopped.set()
            tick(drive)

        return on_tick

    def restore(self) -> None:
        signal.signal(signal.SIGINT, self._previous)


def _init_child(target: Target, wires: list[bytes], counts: SynchronizedArray[int], stop: MpEvent) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    _child.update(target=target, wires=wires, counts=counts, stop=stop)


def _child_level(level: LoadLevel, index: int) -> dict[str, object]:
    counts: SynchronizedArray[int] = _child["counts"]
    stop: MpEvent = _child["stop"]

    def tick(drive: Drive) -> None:
        counts[index] = drive.done
        if stop.is_set():
            drive.stopped.set()

    return run_loop(drive_level(_child["target"], _child["wires"], level, tick)).to_dict()
