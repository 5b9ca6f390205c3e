"""gRPC on one HTTP/2 connection: the asyncio adapter between a socket, the engine and the calls.

Our own instead of grpcio's server: grpc.aio costs 0.4-0.6 ms of CPU for an empty call on
this machine, more than a whole small-model inference over our HTTP/1.1 path, and the gRPC
targets are made of that overhead (benchmarks/RESULTS.md). HTTP/2 itself is the sans-IO
:class:`~ortserve.server.http2.engine.Http2Engine`; this protocol feeds it what the socket
reads, turns its events into :class:`~ortserve.server.grpc.call.GrpcCall` s, runs its timer,
and writes what it has to send: what one read produced leaves in one system call.

It owns only what is gRPC's: the calls by stream id and the request bytes they hold
(:class:`~ortserve.server.grpc.held.HeldBytes`), a unary call whose request misses its arrival
deadline (ended DEADLINE_EXCEEDED), and what the connection cap is told: idle (no stream
open), serving (a unary call's whole request is being answered) or receiving (requests
arriving, or only streaming calls, which the cap may close for a new connection). When it
reads is its base's, :class:`~ortserve.server.grpc.read_gate.ReadGate`.

Under overload most infer calls are refused, and at 1,600 connections the loop cannot read
them as fast as they come (issue 30). Three things keep reading and refusing ahead of running:

- **Refused from the whole message, no call.** A unary call whose method has an edge refusal
  (ModelInfer) gets no :class:`GrpcCall` at its HEADERS; when its message arrives whole in one
  DATA frame with END_STREAM (what every client sends for a small request), the edge's verdict
  is asked from the message's first bytes, and a refusal is written as the stream's trailers
  with no call, framer or handler made (a third less CPU per refusal in process:
  benchmarks/RESULTS.md, "gRPC under overload").
  Anything else (a message split over frames, compressed, or trailers) makes the call then and
  takes the call's path as before.
- **Admitted calls run after the reads.** With the loop's :class:`RunQueue` (HTTP's), an
  admitted call waits for the turn that follows the iteration's reads, as an HTTP request does;
  the call asks the verdict again at its turn (the calls before it may have filled the queue).
- **Calls the client already gave up on are dropped unread.** When a read also holds the
  RST_STREAM of a call it opens (a client whose deadline passed while the call sat in the socket
  buffer, which is every call once the loop is behind by a client's deadline), the call is
  never made; a call waiting for its turn is dropped when its reset arrives.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import TypeAlias

from ortserve.server.connection_limit import ARRIVING, AT_REST, SERVING
from ortserve.server.connections import ByteBudget, ConnectionSet
from ortserve.server.grpc.call import GrpcCall
from ortserve.server.grpc.errors import GrpcAbort, StatusCode
from ortserve.server.grpc.framing import whole_message
from ortserve.server.grpc.headers import (
    OK_TRAILERS,
    RESPONSE_HEADERS,
    RequestHead,
    request_head,
    trailers,
    trailers_only,
)
from ortserve.server.grpc.held import HeldBytes
from ortserve.server.grpc.inflate import Inflater
from ortserve.server.grpc.options import GrpcOptions
from ortserve.server.grpc.read_gate import ReadGate
from ortserve.server.grpc.rpc import Rpc
from ortserve.server.http.run_queue import RunQueue
from ortserve.server.http2.engine import Http2Engine
from ortserve.server.http2.events import (
    ConnectionEnded,
    DataReceived,
    RequestReceived,
    StreamReset,
    reset_by_peer,
)
from ortserve.server.http2.frames import ErrorCode
from ortserve.server.read_lag import read_lag_of

__all__ = ["Http2Connection"]

logger = logging.getLogger(__name__)

_EMPTY = memoryview(b"")

_Head: TypeAlias = tuple[RequestHead, Rpc]
"""A unary call with an edge refusal whose message has not arrived: no GrpcCall yet."""
_Admitted: TypeAlias = tuple[RequestHead, Rpc, memoryview | bytes]
"""A call admitted from its whole message, waiting for its turn after the loop's reads."""


class Http2Connection(ReadGate):
    """Serves gRPC calls on one HTTP/2 connection.

    Args:
        routes: ``/package.Service/Method`` to its :class:`Rpc`.
        settings: limits and keepalive timers.
        connections: the listener's set, joined on connect and left on close.
        loop: the running loop.
        inflater: the listener's decompression queue, shared by its connections.
        budget: the server-wide bound on request bytes held, shared with HTTP.
        runs: the loop's run queue: admitted unary calls run after the iteration's reads
            (``http/run_queue.py``); without one, at once.
    """

    def __init__(
        self,
        routes: Mapping[str, Rpc],
        settings: GrpcOptions,
        connections: ConnectionSet[Http2Connection],
        loop: asyncio.AbstractEventLoop,
        inflater: Inflater,
        budget: ByteBudget | None = None,
        runs: RunQueue | None = None,
    ) -> None:
        super().__init__(loop)
        self._routes = routes
        self._runs = runs
        self._lag = read_lag_of(loop)  # the loop's meter of the wait before reading
        self._heads: dict[int, _Head] = {}
        self._admitted: dict[int, _Admitted] = {}
        self._inflater = inflater
        self._settings = settings
        self._connections = connections
        self._told = SERVING  # the gate in front of it tells the cap until the first bytes
        self._streaming = 0  # streaming calls among self._calls
        self._received = 0  # bytes read (the connection cap ranks progress by it)
        config = settings.engine()
        self._engine: Http2Engine[RequestHead] = Http2Engine(config, request_head, time.monotonic)
        self._calls: dict[int, GrpcCall] = {}
        budget = budget if budget is not None else ByteBudget(1 << 62)
        self._held = HeldBytes(budget, 2 * settings.max_message_bytes + config.stream_window)
        self._in_read = False
        self._intake = connections.intake
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # the loop time the timer fires at
        # The soonest a request just begun can be late (none has made progress yet).
        self._first_due = min(config.request_grace_s, config.request_timeout_s)

    # -- asyncio.Protocol -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport
        self._connections.connections.add(self)
        self._engine.initiate()
        self._flush()
        self._on_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._connections.discard(self)
        self._intake.forget(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._cancel_all()

    def unpark(self) -> None:
        super().unpark()
        if self._engine.awaiting and self._timer is not None:  # the requests' clocks run again
            self._timer.cancel()
            self._arm(self._loop.time())

    def _skip(self, seconds: float) -> None:
        self._engine.postpone_requests(seconds)

    def data_received(self, data: bytes) -> None:
        self._in_read = True
        self._received += len(data)
        calls = self._calls
        engine = self._engine
        resets = engine.peer_resets
        try:
            events = engine.receive_data(data)
            # Streams this read opens and the client also reset in it are never started.
            gone = reset_by_peer(events) if engine.peer_resets != resets else _NONE_GONE
            for event in events:
                if type(event) is DataReceived:
                    stream_id = event.stream_id
                    call = calls.get(stream_id)
                    if call is not None:
                        self._receive(call, event.data, event.end_stream)
                    elif stream_id in self._heads:
                        head, rpc = self._heads.pop(stream_id)
                        if stream_id not in gone:
                            self._first_data(stream_id, head, rpc, event.data, event.end_stream)
                    else:  # the call already ended: the bytes are dropped, the window kept open
                        engine.consumed(stream_id)
                elif type(event) is RequestReceived:
                    if event.stream_id not in gone:
                        self._on_request(event)
                elif type(event) is StreamReset:
                    self._on_reset(event.stream_id)
                elif type(event) is ConnectionEnded:
                    logger.debug("closing an HTTP/2 connection: %s (%s)", event.message, event.code.name)
                    self._cancel_all()
        except Exception:
            logger.exception("unexpected error on an HTTP/2 connection")
            engine.close(ErrorCode.INTERNAL_ERROR, "internal error")
            self._cancel_all()
        finally:
            self._in_read = False
        if engine.awaiting and self._timer is not None:
            due = self._loop.time() + self._first_due
            if due < self._timer_at:  # a request began: its deadline may come before the timer
                self._timer.cancel()
                self._arm(due)
        self._flush()
        if self._intake.saturated:
            self._intake.admit_more(self)

    # -- events -----------------------------------------------------------------------
    def _on_request(self, event: RequestReceived[RequestHead]) -> None:
        """Answer what cannot be a call at once; otherwise start the call (a unary call with an
        edge refusal: once its message is read)."""
        head, stream_id = event.head, event.stream_id
        refusal = head.refusal()
        rpc = self._routes.get(head.path) if refusal is None else None
        if rpc is None:
            if refusal is None:
                refusal = (200, StatusCode.UNIMPLEMENTED, f"unknown method {head.path}")
            status, code, message = refusal
            self._engine.send_headers(stream_id, trailers_only(code, message, http_status=status), True)
            return
        if rpc.refuse is not None:
            self._lag.observe()  # the wait before this read feeds admission
            if not event.end_stream:
                self._heads[stream_id] = (head, rpc)
                return
        call = self._start(stream_id, head, rpc)
        if event.end_stream:
            self._receive(call, _EMPTY, True)

    def _start(self, stream_id: int, head: RequestHead, rpc: Rpc) -> GrpcCall:
        call = GrpcCall(
            self, stream_id, head, rpc, self._loop, self._settings.max_message_bytes, self._inflater
        )
        self._calls[stream_id] = call
        if rpc.streaming is not None:
            self._streaming += 1
            self._engine.open_ended(stream_id)  # its messages come at the client's pace
        call.start()
        return call

    def _first_data(
        self, stream_id: int, head: RequestHead, rpc: Rpc, payload: memoryview, end_stream: bool
    ) -> None:
        """The first DATA of a unary call with an edge refusal: a whole message is refused
        without a call, or admitted to run after the reads; anything else starts the call."""
        assert rpc.refuse is not None
        message = whole_message(payload) if end_stream else None
        if message is None:
            self._receive(self._start(stream_id, head, rpc), payload, end_stream)
            return
        verdict = rpc.refuse(message, head)
        if isinstance(verdict, bytes):
            self._engine.send_headers(stream_id, verdict, True)
            return
        runs = self._runs
        if runs is None or not self._held.take(len(payload)):
            self._receive(self._start(stream_id, head, rpc), payload, end_stream)
            return
        # A small message must not pin the whole read's buffer while it waits.
        kept = payload if 2 * len(payload) >= memoryview(payload.obj).nbytes else bytes(payload)
        self._admitted[stream_id] = (head, rpc, kept)
        runs.defer(self)

    def run_deferred(self) -> None:
        """The turn of this connection's oldest admitted call (``RunQueue``): make it and give
        it its message; it asks the verdict again, then decodes and submits. Nothing when the
        call was reset or the connection closed meanwhile."""
        admitted = self._admitted
        if not admitted:
            return
        stream_id = next(iter(admitted))
        head, rpc, payload = admitted.pop(stream_id)
        self._held.give(len(payload))
        if self._closed:
            return
        self._receive(self._start(stream_id, head, rpc), memoryview(payload), True)
        self._flush()

    def _receive(self, call: GrpcCall, payload: memoryview, end_stream: bool) -> None:
        """Hand request bytes to the call, holding the connection to its memory bound; the
        client may send more once the call has taken them."""
        call.receive(payload, end_stream)
        stream_id = call.stream_id
        if self._calls.get(stream_id) is not call:
            return  # the call ended while it took them
        if not end_stream and not call.backlogged:
            self._engine.consumed(stream_id)
        refusal = self._held.update(stream_id, call.held)
        if refusal is not None:
            call.fail(GrpcAbort(StatusCode.RESOURCE_EXHAUSTED, refusal))

    def _on_reset(self, stream_id: int) -> None:
        self._heads.pop(stream_id, None)
        self._drop_admitted(stream_id)
        call = self._forget(stream_id)
        if call is not None:
            call.cancel()

    def _forget(self, stream_id: int) -> GrpcCall | None:
        self._held.released(stream_id)
        call = self._calls.pop(stream_id, None)
        if call is not None and not call.unary:
            self._streaming -= 1
        return call

    def _drop_admitted(self, stream_id: int) -> None:
        admitted = self._admitted.pop(stream_id, None)
        if admitted is not None:
            self._held.give(len(admitted[2]))

    def _cancel_all(self) -> None:
        self._heads.clear()
        for stream_id in list(self._admitted):
            self._drop_admitted(stream_id)
        calls = list(self._calls.values())
        self._calls.clear()
        self._streaming = 0
        self._held.clear()
        for call in calls:
            call.cancel()

    # -- CallOwner --------------------------------------------------------------------
    def send_answer(self, call: GrpcCall, payload: bytes) -> None:
        stream_id = call.stream_id
        self._calls.pop(stream_id, None)  # a unary call's (streaming calls end with trailers)
        self._held.released(stream_id)
        ending = trailers(StatusCode.OK, "", call.trailing) if call.trailing else OK_TRAILERS
        self._engine.send_response(stream_id, RESPONSE_HEADERS, payload, ending)
        if not self._in_read:
            self._flush()

    def send_headers(self, call: GrpcCall, block: bytes) -> None:
        self._engine.send_headers(call.stream_id, block)
        if not self._in_read:
            self._flush()

    def send_message(self, call: GrpcCall, payload: bytes) -> None:
        self._engine.send_data(call.stream_id, payload)
        if not self._in_read:
            self._flush()

    def send_trailers(self, call: GrpcCall, block: bytes) -> None:
        self._forget(call.stream_id)
        self._engine.send_headers(call.stream_id, block, end_stream=True)
        if not self._in_read:
            self._flush()

    def drained(self, call: GrpcCall) -> None:
        self._engine.consumed(call.stream_id)
        if not self._in_read:
            self._flush()

    # -- writing and lifecycle --------------------------------------------------------
    def _flush(self) -> None:
        """Write what the engine has to send (at the end of a read: once for the whole read),
        and close the transport once the engine is done."""
        if self._in_read or self._transport is None or self._closed:
            return
        out = self._engine.data_to_send()
        if out:
            self._transport.writelines(out)
        if self._engine.closed:
            self._closed = True
            self._transport.close()
            return
        # A connection with no call open may make room for a new one at the cap, as an idle
        # HTTP/1.1 keep-alive connection does; so may one whose calls are still arriving
        # (10,000 connections that opened a call and went silent held every place until
        # keepalive, two hours); one answering a whole request may not. Until its first bytes
        # the gate in front of it speaks for it.
        engine = self._engine
        if not self._received:
            return
        if not engine.open_streams:
            told = AT_REST
        elif len(self._calls) + len(self._admitted) > self._streaming + len(engine.awaiting):
            # A unary call whose request is whole: the calls still arriving are the streams the
            # engine times, a call answered and waiting for window is no longer a call.
            told = SERVING
        else:
            told = ARRIVING
        if told != self._told:
            self._told = told
            self._connections.limit.tell(self, told)

    @property
    def received(self) -> int:
        """Bytes read from the peer so far (the connection cap ranks progress by it)."""
        return self._received

    def evict(self) -> None:
        """The connection cap needs this place (no call open, or calls arriving slower than
        the other connections' requests): GOAWAY, then close; calls open are cancelled."""
        self._connections.discard(self)
        if not self._closed:
            self._engine.close(ErrorCode.NO_ERROR, "closed to make room for a new connection")
            self._flush()  # the GOAWAY, then the close (the engine is done)

    def go_away(self) -> None:
        """Shutdown: take no new calls, finish the ones in flight, then close."""
        if self._closed or self._transport is None:
            return
        self._engine.go_away()
        for call in list(self._calls.values()):
            call.stop_reading()
        self._flush()

    def abort(self) -> None:
        """Shutdown grace ran out: end every call and drop the connection."""
        for call in list(self._calls.values()):
            call.fail(GrpcAbort(StatusCode.UNAVAILABLE, "the server is shutting down"))
            call.cancel()
        if self._transport is not None and not self._closed:
            self._closed = True
            self._transport.abort()

    def _on_timer(self) -> None:
        """The engine's timers (preface deadline, requests' arrival, keepalive) on the loop's
        clock."""
        self._timer = None
        if self._closed:
            return
        if self._engine.awaiting and not self._parked:
            late = self._engine.expired_requests()
            for stream_id in late:
                call = self._calls.get(stream_id)
                head = self._heads.pop(stream_id, None) if call is None else None
                if head is not None:  # no message yet, so no call: made to end as a call does
                    call = self._start(stream_id, *head)
                if call is None:
                    self._engine.reset_stream(stream_id, ErrorCode.CANCEL)
                else:  # answered, then the stream reset (the client may still be sending)
                    call.fail(GrpcAbort(StatusCode.DEADLINE_EXCEEDED, "the request was not received in time"))
            if late:
                # Read nothing from this peer for three times the grace a request gets. A peer
                # that re-opens a stalled call at once (issue 27's sustained attack: 10,000 of
                # them) made the server end ~300 calls a second; resting, the connection has no
                # call open and is the first the cap evicts, and the attack's calls ended halved
                # (server CPU -20%, probe medians 2-3x lower; benchmarks/RESULTS.md, "issue 27,
                # the three open points"). A real client's other calls keep their clocks.
                self._rest(3 * self._first_due)
        delay = self._engine.tick(requests_timed=not self._parked)
        self._flush()
        if delay is not None:
            self._arm(self._loop.time() + delay)

    def _arm(self, when: float) -> None:
        self._timer_at = when
        self._timer = self._loop.call_at(when, self._on_timer)


_NONE_GONE: frozenset[int] = frozenset()
