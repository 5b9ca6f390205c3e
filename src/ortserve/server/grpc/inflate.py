"""Decompressing gRPC messages a slice per loop tick, with the size cap checked as they inflate.

A 64 KiB gzip message can inflate to 64 MiB, about 0.3 s of CPU: done at once on the event
loop, 50 of them stalled every HTTP and gRPC client of the server for seconds. Here a message
inflates at once only while the current tick's budget lasts (so ordinary compressed calls
answer without delay); beyond that it waits in one FIFO queue that inflates at most
``slice_bytes`` per loop tick, so other callbacks and socket reads run in between. The queue is
per listener: one bomb at a time holds memory, and compressed calls wait behind it while
uncompressed ones do not notice.
"""

from __future__ import annotations

import asyncio
import zlib
from collections import deque
from collections.abc import Callable

from ortserve.server.grpc.errors import GrpcAbort, StatusCode
from ortserve.server.inflate_ratio import MAX_INFLATE_RATIO, inflate_limit

__all__ = ["InflateJob", "Inflater"]

DEFAULT_SLICE_BYTES = 64 << 10


class InflateJob:
    """One message being inflated; :meth:`take` gives the result once :attr:`done`."""

    __slots__ = (
        "_error",
        "_inflater",
        "_limit",
        "_out",
        "_size",
        "_size_limit",
        "_tail",
        "cancelled",
        "done",
        "on_done",
    )

    def __init__(self, data: bytes | bytearray | memoryview, wbits: int, limit: int) -> None:
        self._inflater = zlib.decompressobj(wbits)
        self._tail: bytes | bytearray | memoryview = data
        self._size_limit = limit
        self._limit = inflate_limit(len(data), limit)  # a ratio too: see inflate_ratio.py
        # A message of several steps grows in one bytearray (realloc moves its pages rather than
        # copying them): joining 64 MiB of slices at the end took 0.2 s in one tick, and
        # protobuf parses a bytearray without copying it (a memoryview it copies).
        self._out: bytes | bytearray = b""
        self._size = 0
        self._error: GrpcAbort | None = None
        self.done = False
        self.cancelled = False
        self.on_done: Callable[[InflateJob], None] | None = None
        """Called when a queued job finishes (not when it finishes within :meth:`Inflater.submit`)."""

    def step(self, budget: int) -> int:
        """Inflate up to ``budget`` more bytes; returns the work done (bytes in or out)."""
        before = len(self._tail)
        try:
            out = self._inflater.decompress(self._tail, min(budget, self._limit + 1 - self._size))
        except zlib.error as exc:
            return self._finish(
                before, GrpcAbort(StatusCode.INTERNAL, f"cannot decompress the message: {exc}")
            )
        self._tail = self._inflater.unconsumed_tail
        if not self._out:
            self._out = out  # most messages inflate in one step: no copy
        elif out:
            if isinstance(self._out, bytes):
                self._out = bytearray(self._out)
            self._out += out
        self._size += len(out)
        work = max(len(out), before - len(self._tail))
        if self._size > self._limit:
            message = f"decompressed message larger than max ({self._limit})"
            if self._limit < self._size_limit:
                message = f"decompressed message more than {MAX_INFLATE_RATIO} times its compressed size"
            return self._finish(work, GrpcAbort(StatusCode.RESOURCE_EXHAUSTED, message))
        if self._inflater.eof:
            return self._finish(work, None)
        if not out and not self._tail:  # zlib returns what it could of a cut stream, without an error
            return self._finish(
                work, GrpcAbort(StatusCode.INTERNAL, "cannot decompress the message: it is truncated")
            )
        return work

    def keep_input(self) -> None:
        """Copy what is left of a view: a queued job must not pin the whole read buffer."""
        if isinstance(self._tail, memoryview):
            self._tail = bytes(self._tail)

    def _finish(self, work: int, error: GrpcAbort | None) -> int:
        self.done = True
        self._error = error
        self._tail = b""
        if error is not None:
            self._out = b""
        return work

    def take(self) -> bytes | bytearray:
        """The inflated message.

        Raises:
            GrpcAbort: it was not valid, was cut, or inflated past the limit.
        """
        if self._error is not None:
            raise self._error
        out, self._out = self._out, b""
        return out


class Inflater:
    """The listener's decompression queue: a bounded slice of inflation per loop tick.

    Args:
        loop: the running loop.
        slice_bytes: the most bytes inflated (or consumed) per tick, over all messages.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, slice_bytes: int = DEFAULT_SLICE_BYTES) -> None:
        self._loop = loop
        self._slice = slice_bytes
        self._queue: deque[InflateJob] = deque()
        self._spent = 0
        self._tick_armed = False

    def submit(self, data: bytes | bytearray | memoryview, wbits: int, limit: int) -> InflateJob:
        """Start inflating ``data`` (zlib ``wbits``) up to ``limit`` bytes.

        The job is :attr:`~InflateJob.done` on return when this tick's budget sufficed;
        otherwise set its ``on_done`` and it is called from a later tick. ``data`` must stay
        unchanged until then.
        """
        job = InflateJob(data, wbits, limit)
        if not self._queue and self._spent < self._slice:
            self._arm()
            while not job.done and self._spent < self._slice:
                self._spent += job.step(self._slice - self._spent)
            if job.done:
                return job
        job.keep_input()
        self._queue.append(job)
        self._arm()
        return job

    def _arm(self) -> None:
        if not self._tick_armed:
            self._tick_armed = True
            self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        """A new tick: its budget goes to the queue, oldest job first."""
        self._tick_armed = False
        self._spent = 0
        queue = self._queue
        while queue and self._spent < self._slice:
            job = queue[0]
            if not job.cancelled:
                self._spent += job.step(self._slice - self._spent)
                if not job.done:
                    continue
            queue.popleft()
            if job.on_done is not None and not job.cancelled:
                job.on_done(job)
        if queue or self._spent:
            self._arm()  # more to do, or this tick's spending must be forgotten next tick
