"""Closed- and open-loop load on keep-alive connections, latency measured from intended send times."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass

from ortserve.loadtest.measurement import Measurement
from ortserve.loadtest.schedule import Arrivals, ArrivalSchedule
from ortserve.loadtest.transports import Target

__all__ = ["Drive", "LoadLevel", "SendFn", "bench_arrivals", "closed_loop", "drive_level", "open_loop"]

SendFn = Callable[[int, int], Awaitable[tuple[int, float]]]
"""``send(worker, payload_index) -> (status, perf_counter at the reply)``: one request on the
worker's own connection."""

_TICK_S = 0.2
_TIMER_SLACK_S = 0.001


@dataclass(frozen=True, slots=True)
class LoadLevel:
    """One level of a sweep: a concurrency (closed loop) or a rate (open loop).

    Args:
        concurrency: requests kept in flight, each sent as soon as the previous returns.
        rate: requests per second sent on schedule whatever the server does.
        arrivals: open-loop gaps, ``poisson`` or ``uniform``.
        duration_s: how long to measure (after warm-up); None with ``requests``.
        requests: how many requests to measure; None with ``duration_s``.
        warmup_s: load sent first and not measured.
        timeout_s: one request's limit before it counts as a timeout.
        connections: open loop: most connections (a request waits for a free one, and the
            wait counts in its latency).
        seed: seeds Poisson arrivals.
        phase: shifts uniform arrivals by this fraction of a gap (set per generator process,
            so that processes sharing a rate interleave instead of sending together).
    """

    concurrency: int | None = None
    rate: float | None = None
    arrivals: Arrivals = "poisson"
    duration_s: float | None = 10.0
    requests: int | None = None
    warmup_s: float = 0.0
    timeout_s: float = 30.0
    connections: int = 64
    seed: int = 0
    phase: float = 0.0

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of concurrency and rate")
        if self.duration_s is None and self.requests is None:
            raise ValueError("give a duration or a request count")

    @property
    def label(self) -> str:
        return f"concurrency {self.concurrency}" if self.rate is None else f"rate {self.rate:g}/s"

    def share(self, index: int, parts: int) -> LoadLevel | None:
        """This level's part for generator process ``index`` of ``parts`` (None: nothing to do)."""
        requests = None if self.requests is None else _split(self.requests, index, parts)
        if requests == 0:
            return None
        if self.concurrency is not None:
            concurrency = _split(self.concurrency, index, parts)
            if concurrency == 0:
                return None
            return _replace(self, concurrency=concurrency, requests=requests)
        assert self.rate is not None
        connections = max(1, _split(self.connections, index, parts))
        return _replace(
            self,
            rate=self.rate / parts,
            requests=requests,
            connections=connections,
            seed=self.seed + index,
            phase=index / parts,
        )


def _split(total: int, index: int, parts: int) -> int:
    return total // parts + (1 if index < total % parts else 0)


def _replace(level: LoadLevel, **changes: object) -> LoadLevel:
    fields = {name: getattr(level, name) for name in LoadLevel.__dataclass_fields__}
    fields.update(changes)
    return LoadLevel(**fields)


class Drive:
    """The shared state of one level in one process: clock, stop conditions, measurement."""

    def __init__(self, level: LoadLevel, measurement: Measurement | None = None) -> None:
        self.level = level
        self.measurement = measurement or Measurement()
        self.start = time.perf_counter()
        self._cpu_start = time.process_time()
        self.measure_from = self.start + level.warmup_s
        self.deadline = float("inf") if level.duration_s is None else self.measure_from + level.duration_s
        self.remaining = level.requests if level.requests is not None else -1
        self.stopped = asyncio.Event()
        self.done = 0
        self._last = self.measure_from

    def may_send(self, now: float) -> bool:
        """Whether another request may start now (and reserve it from the request count)."""
        if self.stopped.is_set() or now >= self.deadline or self.remaining == 0:
            return False
        if self.remaining > 0 and now >= self.measure_from:
            self.remaining -= 1
        return True

    def finish(self, intended: float, sent: tuple[int, float], origin: float | None = None) -> None:
        """Record a reply to a request meant to leave at ``intended`` (perf_counter seconds).

        Latency counts from ``origin`` (default: ``intended``); open loop passes the earlier
        of the intended and the actual send time.
        """
        status, now = sent
        self.done += 1
        if intended < self.measure_from:
            return
        self._last = max(self._last, now)
        latency_us = int((now - (intended if origin is None else origin)) * 1e6)
        self.measurement.record(int(intended - self.measure_from), status, latency_us)

    def close(self) -> Measurement:
        """The measurement, its elapsed time from the end of warm-up to the last reply."""
        self.measurement.elapsed_s = max(0.0, self._last - self.measure_from)
        self.measurement.cpu_s = time.process_time() - self._cpu_start
        self.measurement.wall_s = time.perf_counter() - self.start
        self.measurement.interrupted = self.stopped.is_set()
        return self.measurement


async def closed_loop(drive: Drive, send: SendFn, payload_count: int) -> None:
    """``concurrency`` workers, each sending its next request when the previous returns."""
    concurrency = drive.level.concurrency or 1

    async def worker(index: int) -> None:
        for sequence in itertools.count(index, concurrency):
            start = time.perf_counter()
            if not drive.may_send(start):
                return
            drive.finish(start, await send(index, sequence % payload_count))

    await asyncio.gather(*(worker(index) for index in range(concurrency)))


async def open_loop(drive: Drive, send: SendFn, arrivals: Iterable[tuple[float, int]]) -> None:
    """Send ``(offset, payload_index)`` arrivals on schedule through a pool of connections.

    A request whose connection is busy waits in a queue; its latency still counts from its
    intended send time, so a slow server cannot hide queueing (no coordinated omission).
    """
    queue: asyncio.Queue[tuple[float, int] | None] = asyncio.Queue()
    workers = drive.level.connections

    async def worker(index: int) -> None:
        while (item := await queue.get()) is not None:
            intended, payload = item
            if drive.stopped.is_set():
                continue
            sent = time.perf_counter()
            if intended >= drive.measure_from:
                drive.measurement.send_lag.record(int((sent - intended) * 1e6))
            drive.finish(intended, await send(index, payload), min(intended, sent))

    tasks = [asyncio.create_task(worker(index)) for index in range(workers)]
    try:
        await _dispatch(drive, queue, arrivals)
        for _ in tasks:
            queue.put_nowait(None)
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()


async def _dispatch(
    drive: Drive, queue: asyncio.Queue[tuple[float, int] | None], arrivals: Iterable[tuple[float, int]]
) -> None:
    for offset, payload in arrivals:
        intended = drive.start + offset
        delay = intended - time.perf_counter()
        if delay > _TIMER_SLACK_S:
            # Event-loop timers fire up to a millisecond late: wake a little early instead,
            # and count latency from the actual send when it precedes the intended time.
            await _pause(drive, delay - _TIMER_SLACK_S)
        if not drive.may_send(intended):
            return
        queue.put_nowait((intended, payload))


async def _pause(drive: Drive, delay: float) -> None:
    """Sleep until the next arrival; a long gap (replays) ends early when the run is stopped."""
    if delay < _TICK_S:
        await asyncio.sleep(delay)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(drive.stopped.wait(), delay)


def bench_arrivals(level: LoadLevel, payload_count: int) -> Iterator[tuple[float, int]]:
    """Open-loop arrivals at the level's rate, cycling through the payloads."""
    assert level.rate is not None
    schedule = ArrivalSchedule(level.rate, level.arrivals, level.seed, level.phase)
    return ((offset, index % payload_count) for index, offset in enumerate(schedule.offsets()))


async def drive_level(
    target: Target,
    wires: list[bytes],
    level: LoadLevel,
    on_tick: Callable[[Drive], None] | None = None,
) -> Measurement:
    """Run one level against ``target`` in this process and return what it measured.

    Args:
        wires: pre-built requests (HTTP request bytes or serialized gRPC messages), used in turn.
        on_tick: called every 0.2 s with the running drive (progress, stop requests).
    """
    drive = Drive(level)
    clients, close = target.open_clients(level.concurrency or level.connections, level.timeout_s)

    async def send(worker: int, index: int) -> tuple[int, float]:
        reply = await clients[worker].send(wires[index])
        return reply.status, time.perf_counter()

    ticker = asyncio.create_task(_tick(drive, on_tick)) if on_tick is not None else None
    try:
        if level.concurrency is not None:
            await closed_loop(drive, send, len(wires))
        else:
            await open_loop(drive, send, bench_arrivals(level, len(wires)))
    finally:
        if ticker is not None:
            ticker.cancel()
        await close()
    return drive.close()


async def _tick(drive: Drive, on_tick: Callable[[Drive], None]) -> None:
    while True:
        await asyncio.sleep(_TICK_S)
        on_tick(drive)
