"""Decompression a slice per loop tick: small messages at once, bombs spread over ticks and capped."""

from __future__ import annotations

import asyncio
import gzip
import tracemalloc
import zlib

import pytest

from ortserve.server.grpc.errors import GrpcAbort, StatusCode
from ortserve.server.grpc.inflate import InflateJob, Inflater

GZIP = 31
SLICE = 64 << 10


class Ticks:
    """Counts loop iterations by re-arming itself with call_soon."""

    def __init__(self) -> None:
        self.count = 0
        self.stopped = False
        asyncio.get_running_loop().call_soon(self._tick)

    def _tick(self) -> None:
        if not self.stopped:
            self.count += 1
            asyncio.get_running_loop().call_soon(self._tick)


async def finished(job: InflateJob) -> None:
    done = asyncio.get_running_loop().create_future()
    job.on_done = lambda _: done.set_result(None)
    await asyncio.wait_for(done, 5.0)


async def test_a_small_message_inflates_at_once() -> None:
    inflater = Inflater(asyncio.get_running_loop(), SLICE)
    job = inflater.submit(gzip.compress(b"hello " * 100), GZIP, 1 << 20)
    assert job.done and job.take() == b"hello " * 100


async def test_a_large_message_inflates_over_many_ticks_while_the_loop_runs_other_work() -> None:
    inflater = Inflater(asyncio.get_running_loop(), SLICE)
    data = bytes(range(256)) * (8192 * 4)  # 8 MiB
    job = inflater.submit(gzip.compress(data), GZIP, 16 << 20)
    assert not job.done
    ticks = Ticks()
    await finished(job)
    ticks.stopped = True
    assert job.take() == data
    assert ticks.count >= len(data) // SLICE - 2  # the loop went round between slices


async def test_the_size_cap_is_checked_as_the_message_inflates() -> None:
    inflater = Inflater(asyncio.get_running_loop(), SLICE)
    bomb = gzip.compress(bytes(16 << 20))  # 16 MiB of zeros in about 16 KiB
    tracemalloc.start()
    try:
        job = inflater.submit(bomb, GZIP, 1 << 20)
        await finished(job)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    with pytest.raises(GrpcAbort) as caught:
        job.take()
    assert caught.value.code == StatusCode.RESOURCE_EXHAUSTED
    assert peak < (1 << 20) + 4 * SLICE  # never much more than the limit, let alone 16 MiB


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (gzip.compress(bytes(300 << 10))[:-8], "truncated"),
        (gzip.compress(bytes(300 << 10))[:200], "truncated"),
        (b"not gzip at all", "cannot decompress"),
    ],
)
async def test_cut_or_invalid_data_fails_whether_it_finishes_at_once_or_later(
    body: bytes, message: str
) -> None:
    inflater = Inflater(asyncio.get_running_loop(), 1024)
    job = inflater.submit(body, GZIP, 1 << 20)
    if not job.done:
        await finished(job)
    with pytest.raises(GrpcAbort, match=message) as caught:
        job.take()
    assert caught.value.code == StatusCode.INTERNAL


async def test_queued_messages_finish_in_order_and_a_cancelled_one_is_skipped() -> None:
    inflater = Inflater(asyncio.get_running_loop(), SLICE)
    finished_order: list[int] = []
    jobs = [inflater.submit(zlib.compress(bytes([i]) * (300 << 10)), 15, 1 << 20) for i in range(3)]
    assert not any(job.done for job in jobs)
    for i, job in enumerate(jobs):
        job.on_done = lambda _, i=i: finished_order.append(i)
    jobs[1].cancelled = True
    await finished(jobs[2])
    assert finished_order == [0]  # jobs[2]'s own callback was replaced by finished()
    assert jobs[0].take() == bytes([0]) * (300 << 10)


async def test_while_a_queue_waits_even_a_small_message_queues_behind_it() -> None:
    inflater = Inflater(asyncio.get_running_loop(), SLICE)
    big = inflater.submit(gzip.compress(bytes(1 << 20)), GZIP, 2 << 20)
    small = inflater.submit(gzip.compress(b"x"), GZIP, 2 << 20)
    assert not big.done and not small.done
    await finished(small)
    assert big.done and small.take() == b"x"
