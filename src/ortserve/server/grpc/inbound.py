"""The request side of a gRPC call: DATA payloads in, whole request messages held or queued.

:class:`~ortserve.server.grpc.call.GrpcCall` is one class with one state, but reassembling,
inflating in order and delivering request messages is a job of its own, and with the rest
the call was over the project's module size. It lives here as :class:`Inbound`, the call's
base class (its fields are slots of the same object, set in ``GrpcCall.__init__``), not a
separate object: a call or message costs no extra object or call for the split; the methods
moved, nothing else did.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from ortserve.server.grpc.errors import GrpcAbort, StatusCode
from ortserve.server.grpc.framing import MessageFramer
from ortserve.server.grpc.headers import RequestHead
from ortserve.server.grpc.inflate import InflateJob, Inflater
from ortserve.server.grpc.messages import wbits
from ortserve.server.grpc.rpc import Rpc

__all__ = ["Inbound"]

_COPY_BELOW = 4096
"""A streaming call's queued message smaller than this is copied out of the read buffer (a
memoryview object is ~180 bytes, more than such a message)."""


class Inbound:
    """A call's request messages: framed, inflated in order, then held (unary) or queued
    (streaming) for the handler. :class:`~ortserve.server.grpc.call.GrpcCall` is the one
    subclass and sets every field in its ``__init__``; the request side's fields are slots
    here, the ones only read here are the call's."""

    __slots__ = (
        "_after",
        "_after_bytes",
        "_framer",
        "_inbox",
        "_inflater",
        "_inflating",
        "_input_ended",
        "_request",
    )

    _after: deque[tuple[bytes, bool]] | None
    _after_bytes: int
    _framer: MessageFramer
    _inbox: deque[bytes | bytearray | memoryview]
    _inflater: Inflater
    _inflating: InflateJob | None
    _input_ended: bool
    _request: bytes | bytearray | memoryview | None
    # the call's own (call.py), read here
    head: RequestHead
    _rpc: Rpc
    _max_message: int
    _ended: bool
    _failed: bool

    if TYPE_CHECKING:  # the call's own, in call.py

        def _fail(self, abort: GrpcAbort) -> None: ...

        def _wake(self) -> None: ...

        def _input_complete(self) -> None: ...

    def receive(self, payload: memoryview, end_stream: bool) -> None:
        """Take one DATA frame's payload (padding removed)."""
        if end_stream:
            self._input_ended = True
        if self._ended or self._failed:
            return
        try:
            if payload:
                self._framer.feed(payload, self._complete)
            if end_stream:
                self._end_of_input()
        except GrpcAbort as abort:
            self._fail(abort)
            return
        request = self._request
        # A request waiting for the end of its stream must not pin a much larger read buffer.
        if isinstance(request, memoryview) and 2 * len(request) < memoryview(request.obj).nbytes:
            self._request = bytes(request)

    def _complete(self, data: bytes | bytearray | memoryview, compressed: bool) -> None:
        """One whole message arrived: in order behind one still inflating, else accepted now."""
        if self._inflating is not None:
            if self._after is None:
                self._after = deque()
            self._after.append((bytes(data), compressed))
            self._after_bytes += len(data)
        elif compressed:
            self._accept(data, True)
        else:
            self._deliver(data)

    def _accept(self, data: bytes | bytearray | memoryview, compressed: bool) -> None:
        if compressed:
            job = self._inflater.submit(data, wbits(self.head.encoding), self._max_message)
            if not job.done:  # a large message: it inflates a slice per loop tick
                self._inflating = job
                job.on_done = self._on_inflated
                return
            data = job.take()
        self._deliver(data)

    def _deliver(self, data: bytes | bytearray | memoryview) -> None:
        """Hold the message (unary) or queue it for the handler (streaming)."""
        if self._rpc.streaming is None:
            if self._request is not None:
                raise GrpcAbort(
                    StatusCode.INVALID_ARGUMENT, "a unary call carries exactly one request message"
                )
            self._request = data
            return
        self._inbox.append(bytes(data) if len(data) < _COPY_BELOW else data)
        self._wake()

    def _on_inflated(self, job: InflateJob) -> None:
        """A message inflated over several ticks: deliver it, then what arrived behind it."""
        self._inflating = None
        if self._ended:
            return
        try:
            self._deliver(job.take())
            while self._after and self._inflating is None:
                data, compressed = self._after.popleft()
                self._after_bytes -= len(data)
                self._accept(data, compressed)
            if self._input_ended and self._inflating is None:
                self._input_complete()
        except GrpcAbort as abort:
            self._fail(abort)

    def _stop_inflating(self) -> None:
        if self._inflating is not None:
            self._inflating.cancelled = True
            self._inflating = None
        self._after = None
        self._after_bytes = 0

    def _end_of_input(self) -> None:
        if self._framer.inside_message:
            raise GrpcAbort(StatusCode.INTERNAL, "the stream ended inside a message")
        if self._inflating is None:
            self._input_complete()
