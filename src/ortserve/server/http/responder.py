"""Answering one HTTP/1.1 connection's requests in order: the queue of pipelined requests, the
handler, the answers written (whole, canned, or streamed as chunks), the body bytes held until
answered, and reading held back while answers pile up.

:class:`Responder` is the base class of :class:`~ortserve.server.http.connection.HttpConnection`,
not an object beside it: every request passes from parsing to answering, and as one object each
step stays one method call on ``self``.
"""

from __future__ import annotations

import abc
import asyncio
import functools
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import httptools

from ortserve.protocol.http_codec import encode_error
from ortserve.server.connections import ByteBudget, ConnectionSet
from ortserve.server.http.messages import Deferred, HttpRequest, HttpResponse
from ortserve.server.http.wire import CannedResponse, response_head, status_line

__all__ = ["Handler", "Responder"]

logger = logging.getLogger(__name__)

_A = TypeVar("_A")
_Answer = TypeVar("_Answer")

Handler = Callable[[HttpRequest], "HttpResponse | Deferred[HttpResponse] | Coroutine[Any, Any, HttpResponse]"]

_MAX_PIPELINED = 32


class Responder(asyncio.Protocol, abc.ABC):
    """Runs the handler on each request read, and writes the answers in request order.

    Args:
        handler: the application.
        state: the listener's connections (``closing`` once shutdown began).
        loop: the event loop.
        budget: the server-wide bound on request bytes held.
    """

    _parser: httptools.HttpRequestParser | None
    """The connection's parser (set by the connection): whether a request keeps it alive."""

    def __init__(
        self,
        handler: Handler,
        state: ConnectionSet[Any],
        loop: asyncio.AbstractEventLoop,
        budget: ByteBudget,
    ) -> None:
        self._handler = handler
        self._state = state
        self._loop = loop
        self._budget = budget
        self._transport: asyncio.Transport | None = None
        self._queue: deque[tuple[HttpRequest | CannedResponse, bool, int]] = deque()
        self._task: asyncio.Future[Any] | None = None
        self._busy = False
        self._receiving = False
        self._closed = False
        self._reading = True
        self._write_paused = False
        self._write_paused_at = 0.0
        self._parked = False  # the intake governor paused reading (the loop is saturated)
        self._drained: asyncio.Future[None] | None = None  # a stream waits here for the client
        self._held = 0  # body bytes of this connection's requests not yet answered
        self._answering = 0  # those of the request being handled

    # -- asyncio.Protocol -------------------------------------------------------------
    def pause_writing(self) -> None:
        # The client is not reading its responses: stop reading its requests until it does,
        # so an unread peer cannot make the server buffer without bound.
        self._write_paused = True
        self._write_paused_at = self._loop.time()
        if self._transport is not None and self._reading and not self._closed:
            self._transport.pause_reading()
            self._reading = False

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        if not self._queue:
            self._resume_reading()
        elif not self._busy:
            self._next()  # answers held back while the client was not reading

    def _resume_reading(self) -> None:
        """Read again, unless the client is not reading us or the loop is saturated."""
        if self._reading or self._write_paused or self._parked or self._closed or self._transport is None:
            return
        self._transport.resume_reading()
        self._reading = True

    @abc.abstractmethod
    def _to_idle(self) -> None:
        """Nothing is owed: the connection waits for the next request, or for the rest of one
        arriving (its deadline and idle bookkeeping are the connection's)."""

    # -- request handling -------------------------------------------------------------
    def _enqueue(self, item: HttpRequest | CannedResponse, body_size: int) -> None:
        assert self._parser is not None
        self._queue.append((item, self._parser.should_keep_alive(), body_size))
        if len(self._queue) > _MAX_PIPELINED and self._transport is not None and self._reading:
            self._transport.pause_reading()
            self._reading = False
        if not self._busy:
            self._next()

    def _next(self) -> None:
        while self._queue and not self._closed:
            if self._write_paused:
                # The client is not reading its answers: answer nothing more until it does.
                # One read may hold thousands of pipelined requests, and answering them all
                # into the transport's buffer made 0.7 MB of GETs hold 380 MB of answers.
                self._busy = False
                return
            request, keep_alive, self._answering = self._queue.popleft()
            if isinstance(request, CannedResponse):  # refused from its headers
                self._write_canned(request, keep_alive)
                continue
            self._busy = True
            result = _answer_of(self._handler, request)
            del request  # a deferred answer's callbacks hold what they need of it
            if isinstance(result, HttpResponse):
                if not self._respond(result, keep_alive):
                    return
                continue
            if isinstance(result, Deferred):
                self._task = result.future
                result.future.add_done_callback(
                    functools.partial(self._on_deferred, result, keep_alive=keep_alive)
                )
                return
            task = self._loop.create_task(result)
            self._task = task
            task.add_done_callback(functools.partial(self._on_done, keep_alive=keep_alive))
            return
        self._busy = False
        self._resume_reading()
        if not self._queue and not self._closed:
            self._to_idle()

    def _on_deferred(
        self,
        deferred: Deferred[HttpResponse],
        future: asyncio.Future[Any],
        *,
        keep_alive: bool,
    ) -> None:
        self._task = None
        if future.cancelled():
            return
        response = _answer_of(deferred.finish, future, deferred.failed)
        if self._respond(response, keep_alive):
            self._next()

    def _on_done(self, task: asyncio.Task[HttpResponse], *, keep_alive: bool) -> None:
        self._task = None
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            logger.error("unhandled error in HTTP handler", exc_info=error)
            response = HttpResponse(500, [encode_error("internal server error")])
        else:
            response = task.result()
        if self._respond(response, keep_alive):
            self._next()

    def _respond(self, response: HttpResponse, keep_alive: bool) -> bool:
        """Write ``response``; False when its body streams (the stream then answers and moves on)."""
        if response.stream is None or response.omit_body or self._transport is None or self._closed:
            self._write(response, keep_alive)
            self._answered()
            return True
        task = self._loop.create_task(self._pump(response, keep_alive and not self._state.closing))
        self._task = task
        task.add_done_callback(functools.partial(self._streamed, keep_alive=keep_alive))
        return False

    async def _pump(self, response: HttpResponse, keep_alive: bool) -> None:
        """Send the head, then each piece of the stream as a chunk as soon as it exists."""
        transport = self._transport
        stream = response.stream
        assert transport is not None and stream is not None
        head = [status_line(response.status), b"content-type: ", response.content_type, b"\r\n"]
        head += [name + b": " + value + b"\r\n" for name, value in response.headers]
        head.append(
            b"transfer-encoding: chunked\r\n" + (b"" if keep_alive else b"connection: close\r\n") + b"\r\n"
        )
        transport.writelines([b"".join(head)] + [b"%x\r\n%s\r\n" % (len(c), c) for c in response.chunks if c])
        try:
            async for piece in stream:
                if self._closed:
                    return
                if piece:
                    transport.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                if self._write_paused:  # the client reads slower than we produce: wait for it
                    self._drained = self._loop.create_future()
                    await self._drained
            transport.write(b"0\r\n\r\n")
        finally:
            closer = getattr(stream, "aclose", None)
            if closer is not None:
                await closer()

    def _streamed(self, task: asyncio.Task[None], *, keep_alive: bool) -> None:
        self._task = None
        if task.cancelled() or self._closed:
            return
        error = task.exception()
        if error is not None:  # the head is out: all that is left is to hang up
            logger.error("streamed HTTP response failed", exc_info=error)
            self._close()
            return
        if not keep_alive or self._state.closing:
            self._close()
        self._answered()
        self._next()

    def _write(self, response: HttpResponse, keep_alive: bool) -> None:
        transport = self._transport
        if transport is None or self._closed:
            return
        keep_alive = keep_alive and not self._state.closing
        head = response_head(response, keep_alive)
        transport.writelines([head] if response.omit_body else [head, *response.chunks])
        if not keep_alive:
            self._close()

    def _write_canned(self, response: CannedResponse, keep_alive: bool) -> None:
        if self._transport is None or self._closed:
            return
        keep_alive = keep_alive and not self._state.closing
        self._transport.write(response.wire(keep_alive))
        if not keep_alive:
            self._close()

    def _close(self) -> None:
        if self._transport is not None and not self._closed:
            self._closed = True
            self._transport.close()

    # -- memory -----------------------------------------------------------------------
    def _answered(self) -> None:
        """The request handled last is answered: its body bytes leave the server's budget."""
        if not self._answering:
            return
        self._budget.give(self._answering)
        self._held -= self._answering
        self._answering = 0

    def _forget_bodies(self) -> None:
        """No request of this connection will be answered: give back all its body bytes."""
        self._budget.give(self._held)
        self._held = self._answering = 0


def _answer_of(
    handler: Callable[[_A], _Answer], arg: _A, failed: Callable[[BaseException], _Answer] | None = None
) -> _Answer | HttpResponse:
    """``handler(arg)``, or ``failed``'s answer to what it raised (a deferred answer's failure,
    its request's scope settled there). Without ``failed`` a raise is a bug (the app maps
    every error of its own): the traceback is logged, the client told nothing of it: 500."""
    try:
        return handler(arg)
    except Exception as exc:
        if failed is not None:
            return failed(exc)
        logger.exception("unhandled error in an HTTP handler")
        return HttpResponse(500, [encode_error("internal server error")])
