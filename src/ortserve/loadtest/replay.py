"""Replays captured requests on their original schedule (scaled), optionally against a second target."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ortserve.capture_records import CapturedRequest, read_capture
from ortserve.loadtest.compare import Comparison
from ortserve.loadtest.generator import Drive, LoadLevel, open_loop
from ortserve.loadtest.measurement import Measurement
from ortserve.loadtest.transports import HttpClient, HttpTarget, Payload, Reply

__all__ = ["ReplayResult", "load_capture", "replay"]


@dataclass(slots=True)
class ReplayResult:
    """What a replay measured on the target, and on the compare target when there is one."""

    target: Measurement
    second: Measurement | None = None
    comparison: Comparison | None = None


def load_capture(paths: list[Path], model: str | None = None) -> list[CapturedRequest]:
    """Captured requests (optionally of one model only), in arrival order.

    Raises:
        ValueError: unreadable capture, or no request in it.
    """
    records = [r for r in read_capture(paths) if model is None or r.model == model]
    if not records:
        raise ValueError("the capture holds no request" + (f" for model {model!r}" if model else ""))
    return sorted(records, key=lambda r: r.arrival)


def _payload(record: CapturedRequest) -> Payload:
    return Payload(record.path, record.body, record.headers)


async def replay(
    records: list[CapturedRequest],
    target: HttpTarget,
    speed: float = 1.0,
    second: HttpTarget | None = None,
    connections: int = 64,
    timeout_s: float = 30.0,
    on_tick: Callable[[Drive], None] | None = None,
) -> ReplayResult:
    """Send every record at ``(arrival - first arrival) / speed`` and measure the answers.

    Args:
        second: also send each request here, measure it, and compare the outputs.
    """
    first = records[0].arrival
    arrivals = [((r.arrival - first) / speed, index) for index, r in enumerate(records)]
    span = max(arrivals[-1][0], 1e-3)
    level = LoadLevel(
        rate=len(records) / span,
        duration_s=None,
        requests=len(records),
        timeout_s=timeout_s,
        connections=connections,
    )
    drive = Drive(level)
    result = ReplayResult(drive.measurement)
    sender = _Sender(records, target, level, drive)
    if second is not None:
        sender.compare_with(second, result)

    async def send(worker: int, index: int) -> tuple[int, float]:
        if second is None:
            return await sender.send(worker, index)
        return await sender.send_both(worker, index, result)

    ticker = asyncio.create_task(_tick(drive, on_tick)) if on_tick else None
    try:
        await open_loop(drive, send, arrivals)
    finally:
        if ticker is not None:
            ticker.cancel()
        sender.close()
    drive.close()
    if result.second is not None:
        result.second.elapsed_s = drive.measurement.elapsed_s
    return result


class _Sender:
    """Sends record ``index`` on a worker's connection(s); with a second target, to both."""

    def __init__(
        self, records: list[CapturedRequest], target: HttpTarget, level: LoadLevel, drive: Drive
    ) -> None:
        self._wires = [target.wire(_payload(r)) for r in records]
        self._clients = [HttpClient(target, level.timeout_s) for _ in range(level.connections)]
        self._records = records
        self._level = level
        self._drive = drive
        self._second: list[HttpClient] = []
        self._second_wires: list[bytes] = []

    def compare_with(self, second: HttpTarget, result: ReplayResult) -> None:
        self._second_wires = [second.wire(_payload(r)) for r in self._records]
        self._second = [HttpClient(second, self._level.timeout_s) for _ in range(self._level.connections)]
        result.second, result.comparison = Measurement(), Comparison()

    async def send(self, worker: int, index: int) -> tuple[int, float]:
        reply = await self._clients[worker].send(self._wires[index])
        return reply.status, time.perf_counter()

    async def send_both(self, worker: int, index: int, result: ReplayResult) -> tuple[int, float]:
        assert result.second is not None and result.comparison is not None
        started = time.perf_counter()
        second = asyncio.ensure_future(_timed(self._second[worker], self._second_wires[index]))
        reply, answered = await _timed(self._clients[worker], self._wires[index])
        other, other_answered = await second  # both connections must be free for the next send
        latency_us = int((other_answered - started) * 1e6)
        result.second.record(int(started - self._drive.measure_from), other.status, latency_us)
        result.comparison.add(reply, other)
        return reply.status, answered

    def close(self) -> None:
        for client in [*self._clients, *self._second]:
            client.close()


async def _timed(client: HttpClient, wire: bytes) -> tuple[Reply, float]:
    reply = await client.send(wire)
    return reply, time.perf_counter()


async def _tick(drive: Drive, on_tick: Callable[[Drive], None]) -> None:
    while True:
        await asyncio.sleep(0.2)
        on_tick(drive)
