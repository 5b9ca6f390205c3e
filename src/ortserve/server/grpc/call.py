"""One gRPC call on one HTTP/2 stream: length-prefixed messages in, the handler, messages and status out.

The HTTP/2 engine (:mod:`~ortserve.server.http2`) owns the stream; the connection hands its
DATA here; a call reassembles messages (gRPC over HTTP/2, "Length-Prefixed-Message", through
its :class:`~ortserve.server.grpc.framing.MessageFramer`), decompresses them (both in its base
class, :class:`~ortserve.server.grpc.inbound.Inbound`), runs the method's handler (an
:class:`~ortserve.server.grpc.rpc.Rpc`) and answers through its :class:`CallOwner`. A unary handler may answer at once, with a
:class:`~ortserve.server.grpc.rpc.Deferred` (a future plus the function
that turns its result into the answer, so the common inference path needs no task), or
with a coroutine. A streaming handler is a coroutine that reads and writes messages itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from google.protobuf.message import Message

from ortserve.errors import DeadlineExceeded, OrtServeError
from ortserve.server.grpc.errors import GrpcAbort, StatusCode, abort_from
from ortserve.server.grpc.framing import MessageFramer
from ortserve.server.grpc.headers import RESPONSE_HEADERS, RequestHead, trailers, trailers_only
from ortserve.server.grpc.inbound import Inbound
from ortserve.server.grpc.inflate import InflateJob, Inflater
from ortserve.server.grpc.messages import framed, parse_message
from ortserve.server.grpc.rpc import Deferred, Rpc, StreamHandler

__all__ = ["CallOwner", "GrpcCall"]

# The call's own deadline timer is a backstop for handlers that do not watch the deadline;
# it fires a little late so a handler that does (the scheduler) answers and accounts first.
_DEADLINE_SLACK_S = 0.005
_NO_INBOX: deque[bytes | bytearray | memoryview] = deque()  # unary calls' inbox: nothing is ever put in it


class CallOwner(Protocol):
    """What a call needs from its connection: sending under flow control, and more input.

    The call decides what to send and keeps its own state; the owner only delivers.
    """

    def send_answer(self, call: GrpcCall, payload: bytes) -> None:
        """Headers, one message and OK trailers, ending the call."""

    def send_headers(self, call: GrpcCall, block: bytes) -> None:
        """The response's first header block (not the end of the call)."""

    def send_message(self, call: GrpcCall, payload: bytes) -> None:
        """One more length-prefixed message."""

    def send_trailers(self, call: GrpcCall, block: bytes) -> None:
        """The closing header block, after every queued message; ends the call."""

    def drained(self, call: GrpcCall) -> None:
        """The handler took every queued request message: the client may send more."""


_FAILED: Any = object()
"""What ``GrpcCall._called`` returns when the handler raised (the call has ended)."""


class GrpcCall(Inbound):
    """One call's gRPC state; the HTTP/2 stream under it is the engine's.

    Handlers see :attr:`metadata`, :meth:`time_remaining`, and for streaming methods
    :meth:`read` and :meth:`write`.
    """

    __slots__ = (
        "_deadline",
        "_ended",
        "_failed",
        "_headers_sent",
        "_loop",
        "_max_message",
        "_owner",
        "_reader",
        "_rpc",
        "_stop_reading",
        "_task",
        "_timer",
        "edge_admitted",
        "head",
        "scope_failed",
        "stream_id",
        "trailing",
    )

    def __init__(
        self,
        owner: CallOwner,
        stream_id: int,
        head: RequestHead,
        rpc: Rpc,
        loop: asyncio.AbstractEventLoop,
        max_message: int,
        inflater: Inflater,
    ) -> None:
        self.stream_id = stream_id
        self.head = head
        self._owner = owner
        self._rpc = rpc
        self._loop = loop
        self._max_message = max_message
        self._input_ended = False
        self._ended = False
        self._headers_sent = False
        self._deadline = None if head.timeout_s is None else loop.time() + head.timeout_s
        self._framer = MessageFramer(max_message)
        self._inflater = inflater
        self._inflating: InflateJob | None = None
        self._after: deque[tuple[bytes, bool]] | None = None
        """Messages that arrived while an earlier one inflates: (bytes, compressed); made when
        the first one has to wait."""
        self._after_bytes = 0
        self._request: bytes | bytearray | memoryview | None = None
        # Only a streaming call queues messages; a unary one shares an inbox that stays empty.
        # They are queued as bytes and parsed when the handler reads them: the handler's pace,
        # not the client's, decides how many parsed requests exist (a megabyte of empty
        # messages was 200,000 parses in one read).
        self._inbox: deque[bytes | bytearray | memoryview] = _NO_INBOX if rpc.streaming is None else deque()
        self._reader: asyncio.Future[None] | None = None
        self._stop_reading = False
        self._task: asyncio.Future[Any] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._failed = False
        self.trailing: tuple[tuple[str, str], ...] = ()
        """Trailing metadata a handler adds to an OK end (the degraded mark)."""
        self.edge_admitted = False
        """The method's edge refusal read this call's message and found no load refusal."""
        self.scope_failed: Callable[[BaseException], OrtServeError] | None = None
        """Set by a unary handler that opened a request scope at the Exchange
        (``Exchange.failed`` bound to it): the call's failure settles and finishes it."""

    # -- for handlers -----------------------------------------------------------------
    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The caller's metadata (lowercase names; ``-bin`` values still base64)."""
        return self.head.metadata

    def metadata_value(self, name: str) -> str | None:
        """The first value of a metadata key (lowercase); None when the call has none."""
        for key, value in self.head.metadata:
            if key == name:
                return value
        return None

    def time_remaining(self) -> float | None:
        """Seconds left before the call's deadline; None when it has none."""
        if self._deadline is None:
            return None
        return self._deadline - self._loop.time()

    async def read(self) -> Message | None:
        """The next request message of a streaming call; None once the client is done sending.

        Raises:
            GrpcAbort: INVALID_ARGUMENT or RESOURCE_EXHAUSTED, the message does not parse.
        """
        while not self._inbox:
            if (self._input_ended and self._inflating is None) or self._stop_reading:
                return None
            self._reader = self._loop.create_future()
            await self._reader
        data = self._inbox.popleft()
        if not self._inbox:
            self._owner.drained(self)
        return parse_message(self._rpc.request_type, data)

    def write(self, message: Message) -> None:
        """Send one response message of a streaming call (queued under flow control)."""
        if self._ended:
            return
        if not self._headers_sent:
            self._headers_sent = True
            self._owner.send_headers(self, RESPONSE_HEADERS)
        self._owner.send_message(self, framed(message.SerializeToString()))

    def stop_reading(self) -> None:
        """Drain: :meth:`read` returns None from now on; answers in flight still go out."""
        self._stop_reading = True
        self._wake()

    # -- for the connection -----------------------------------------------------------
    @property
    def ended(self) -> bool:
        """The call sent its end, or was cancelled."""
        return self._ended

    @property
    def held(self) -> int:
        """Request bytes received but not yet handed to the handler (a partial message, or a
        unary request waiting for the end of the stream)."""
        request = self._request
        held = self._framer.held + self._after_bytes
        return held + (0 if request is None else len(request))

    @property
    def max_message(self) -> int:
        """The largest message this call may send or receive (``--grpc-max-message-bytes``)."""
        return self._max_message

    @property
    def unary(self) -> bool:
        """The method takes one request message (a streaming one reads them as they come)."""
        return self._rpc.streaming is None

    @property
    def backlogged(self) -> bool:
        """Messages wait for the handler: the client gets no more window until it takes them."""
        return bool(self._inbox) or self._request is not None or self._inflating is not None

    def start(self) -> None:
        """Headers arrived: a streaming handler starts now, a unary one when its message is in.

        A call with a deadline ends with DEADLINE_EXCEEDED when it passes.
        """
        if self._deadline is not None:
            self._timer = self._loop.call_at(self._deadline + _DEADLINE_SLACK_S, self._on_deadline)
        if self._rpc.streaming is not None:
            task = self._loop.create_task(self._run_streaming(self._rpc.streaming))
            self._task = task
            task.add_done_callback(self._on_task)

    def cancel(self) -> None:
        """The client reset the stream or went away: stop the handler, send nothing more."""
        self._ended = True
        self._stop_timer()
        self._stop_inflating()
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._wake()

    def fail(self, abort: GrpcAbort) -> None:
        """End the call with ``abort`` unless it already ended (the connection's own limits)."""
        self._fail(abort)

    # -- the request is in ------------------------------------------------------------
    def _input_complete(self) -> None:
        """The client is done sending and every message is in: run a unary handler."""
        if self._rpc.streaming is not None:
            self._wake()
            return
        request = self._request
        if request is None:
            raise GrpcAbort(StatusCode.INVALID_ARGUMENT, "a unary call carries exactly one request message")
        self._request = None
        refuse = self._rpc.refuse
        if refuse is not None:
            verdict = refuse(request, self)
            if isinstance(verdict, bytes):
                self._refused(verdict)
                return
            self.edge_admitted = verdict
        self._run_unary(parse_message(self._rpc.request_type, request))

    def _refused(self, block: bytes) -> None:
        """Answer with a refusal already encoded (trailers only): nothing was started."""
        self._stop_timer()
        self._failed = self._ended = True
        self._owner.send_trailers(self, block)

    # -- running handlers -------------------------------------------------------------
    def _run_unary(self, request: Message) -> None:
        assert self._rpc.unary is not None
        result = self._called(self._rpc.unary, request, self)
        if result is _FAILED:
            return
        if isinstance(result, Message):
            self._answer(result)
        elif isinstance(result, Deferred):
            self._task = result.future
            result.future.add_done_callback(functools.partial(self._on_deferred, result.finish))
        else:
            task = self._loop.create_task(result)
            self._task = task
            task.add_done_callback(self._on_task)

    def _on_deferred(
        self, finish: Callable[[asyncio.Future[Any]], Message], done: asyncio.Future[Any]
    ) -> None:
        self._task = None
        if done.cancelled():
            # The client left or the call ended first (its deadline, a limit): the finish
            # still runs, so the request's scope is released (it raises CancelledError).
            with contextlib.suppress(asyncio.CancelledError):
                finish(done)
            return
        if self._ended:
            return
        answer = self._called(finish, done)
        if answer is not _FAILED:
            self._answer(answer)

    def _called(self, handler: Callable[..., Any], *args: Any) -> Any:
        """``handler(*args)``, or ``_FAILED`` after ending the call with what it raised: the
        one guard of a handler called on the loop (a unary handler, a deferred answer's finish);
        a handler's task ends in :meth:`_on_task`, which takes its exception as a value. Either
        way the exception becomes the call's status in :meth:`_abort`."""
        try:
            return handler(*args)
        except Exception as exc:
            self._fail(self._abort(exc))
            return _FAILED

    def _abort(self, exc: BaseException) -> GrpcAbort:
        """The status ``exc`` ends the call with: the request's scope (when its handler opened
        one) finished with the settled error, anything unexpected logged once, INTERNAL."""
        failed = self.scope_failed
        if failed is not None and not isinstance(exc, GrpcAbort):
            self.scope_failed = None
            exc = failed(exc)
        return abort_from(exc)

    def _on_task(self, task: asyncio.Future[Any]) -> None:
        """A handler's task ended, unary or streaming: what it raised is the call's status
        (:meth:`_abort`), a unary one's result its answer (a stream sent its OK end itself); a
        task cancelled while the call still runs was cancelled by the server (shutdown)."""
        self._task = None
        if task.cancelled():
            if not self._ended:
                self._fail(GrpcAbort(StatusCode.UNAVAILABLE, "the server is shutting down"))
            return
        error = task.exception()
        if error is not None:
            self._fail(self._abort(error))
        elif not self._ended:
            self._answer(task.result())

    def _answer(self, message: Message) -> None:
        if self._ended:
            return
        self._stop_timer()
        payload = message.SerializeToString()
        if len(payload) > self._max_message:
            self._fail(
                GrpcAbort(
                    StatusCode.RESOURCE_EXHAUSTED,
                    f"response larger than max ({len(payload)} vs. {self._max_message})",
                )
            )
            return
        self._ended = True
        self._headers_sent = True
        self._owner.send_answer(self, framed(payload))

    async def _run_streaming(self, handler: StreamHandler) -> None:
        """The streaming handler, then the call's OK end; what it raises, or its cancellation,
        ends the call in :meth:`_on_task`, as a unary handler's task does."""
        await handler(self)
        if not self._ended:
            self._stop_timer()
            if not self._headers_sent:
                self._headers_sent = True
                self._owner.send_headers(self, RESPONSE_HEADERS)
            self._ended = True
            self._owner.send_trailers(self, trailers(StatusCode.OK, "", self.trailing))

    def _fail(self, abort: GrpcAbort) -> None:
        if self._ended:
            return
        self._failed = True
        self._stop_timer()
        self._stop_inflating()
        if self._inbox:
            self._inbox.clear()
        self._request = None
        self.stop_reading()  # a streaming handler reads no more; its writes are dropped
        self._ended = True
        if self._headers_sent:
            self._owner.send_trailers(self, trailers(abort.code, abort.message, abort.trailers))
        else:
            self._owner.send_trailers(self, trailers_only(abort.code, abort.message, abort.trailers))
        task = self._task
        # The handler's work is no longer wanted; a handler failing in its own task just ends.
        if task is not None and not task.done() and task is not asyncio.current_task(self._loop):
            task.cancel()

    def _on_deadline(self) -> None:
        self._timer = None
        failed = self.scope_failed
        if failed is not None and not self._ended:  # the request is counted and logged as a 504's
            self.scope_failed = None
            failed(DeadlineExceeded("Deadline Exceeded"))
        self._fail(GrpcAbort(StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _wake(self) -> None:
        reader = self._reader
        if reader is not None and not reader.done():
            reader.set_result(None)
