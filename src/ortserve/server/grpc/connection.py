"""HTTP/2 for gRPC over asyncio: one protocol object per connection (RFC 9113, cleartext, prior knowledge).

Our own instead of grpcio's server: grpc.aio costs 0.4-0.6 ms of CPU for an empty call on
this machine, more than a whole small-model inference over our HTTP/1.1 path, and the gRPC
targets are made of that overhead (benchmarks/RESULTS.md). This module is the receiving state
machine: the preface, frames, HPACK blocks (through :mod:`~ortserve.server.grpc.headers`), the
stream table, receive-side flow control, SETTINGS, PING, RST_STREAM, GOAWAY and keepalive.
Sending under the peer's windows is :mod:`~ortserve.server.grpc.outbound`, flood limits are
:mod:`~ortserve.server.grpc.guards`, and each stream's gRPC semantics live in
:class:`~ortserve.server.grpc.call.GrpcCall`. Writes made while one read is processed go out
in one system call.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from ortserve.server.connections import ConnectionSet
from ortserve.server.grpc.call import GrpcCall, Rpc
from ortserve.server.grpc.errors import GrpcAbort, StatusCode
from ortserve.server.grpc.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_WINDOW,
    FRAME_HEADER,
    MAX_WINDOW,
    PREFACE,
    ErrorCode,
    Flag,
    FrameType,
    Http2Error,
    Setting,
    frame,
    goaway_frame,
    header_frames,
    rst_stream_frame,
    settings_frame,
    unpad,
    window_update_frame,
)
from ortserve.server.grpc.guards import Keepalive, KeepaliveStep, PingStrikes, ResetBudget
from ortserve.server.grpc.headers import (
    HeaderBlockDecoder,
    HeaderError,
    MalformedRequest,
    RequestHead,
    trailers_only,
)
from ortserve.server.grpc.options import GrpcOptions
from ortserve.server.grpc.outbound import Outbound

__all__ = ["Http2Connection"]

logger = logging.getLogger(__name__)

_U32 = struct.Struct(">L")
_MAX_FRAME_SIZE = 1 << 20
_STREAM_WINDOW = 4 << 20
_PREFACE_TIMEOUT_S = 10.0
# A header block may span this many CONTINUATION frames at most (h2's cap too). Real clients
# need one or two; the limit stops a flood of empty frames that would otherwise never end the
# block (CVE-2024-27316's class).
MAX_CONTINUATION_FRAMES = 64


@dataclass(slots=True)
class _OpenHeaderBlock:
    stream_id: int
    flags: int
    parts: list[bytes]
    size: int
    continuations: int = 0


class Http2Connection(asyncio.Protocol):
    """Serves gRPC calls on one HTTP/2 connection.

    Args:
        routes: ``/package.Service/Method`` to its :class:`Rpc`.
        settings: limits and keepalive timers.
        connections: the listener's set, joined on connect and left on close.
        loop: the running loop.
    """

    def __init__(
        self,
        routes: Mapping[str, Rpc],
        settings: GrpcOptions,
        connections: ConnectionSet[Http2Connection],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._routes = routes
        self._settings = settings
        self._connections = connections
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._decoder = HeaderBlockDecoder(settings.max_header_list_bytes)
        # Bytes of an incomplete frame, kept as a list and joined once the frame is whole, so a
        # large frame arriving in many reads is copied once rather than once per read.
        self._partial: list[bytes] = []
        self._partial_size = 0
        self._partial_needed = 0
        self._preface_seen = False
        self._streams: dict[int, GrpcCall] = {}
        self._last_stream_id = 0
        # A header block still open: stream, flags of its HEADERS frame, its fragments, and
        # their running size and CONTINUATION count, so each frame costs O(its own length).
        self._headers_in_progress: _OpenHeaderBlock | None = None
        self._out: list[bytes | memoryview] | None = None
        self._closed = False
        self._going_away = False
        self._reading = True
        # Receive flow control: room for the largest message plus a stream window, so a big
        # message never stalls; past twice the largest message in bytes no handler has taken
        # yet (partial messages, unary requests awaiting their end of stream), the stream
        # adding more is failed. The send side is self._outbound.
        self._connection_window = min(MAX_WINDOW, max(16 << 20, settings.max_message_bytes + _STREAM_WINDOW))
        self._max_held = 2 * settings.max_message_bytes + _STREAM_WINDOW
        self._recv_window = self._connection_window
        self._recv_unacked = 0
        self._outbound = Outbound(self)
        self._held = 0
        self._last_read = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._keepalive = Keepalive(settings.keepalive_time_s, settings.keepalive_timeout_s)
        self._pings = PingStrikes()
        self._resets = ResetBudget()

    # -- asyncio.Protocol -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport
        assert self._transport is not None
        self._connections.connections.add(self)
        self._last_read = self._loop.time()
        settings = {
            Setting.MAX_CONCURRENT_STREAMS: self._settings.max_concurrent_streams,
            Setting.INITIAL_WINDOW_SIZE: _STREAM_WINDOW,
            Setting.MAX_FRAME_SIZE: _MAX_FRAME_SIZE,
            Setting.MAX_HEADER_LIST_SIZE: self._settings.max_header_list_bytes,
            Setting.ENABLE_PUSH: 0,
        }
        grow = self._connection_window - DEFAULT_WINDOW
        self._transport.write(settings_frame(settings) + window_update_frame(0, grow))
        self._timer = self._loop.call_later(_PREFACE_TIMEOUT_S, self._on_timer)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for call in list(self._streams.values()):
            call.cancel()
        self._streams.clear()
        self._outbound.clear()

    def pause_writing(self) -> None:
        # The peer is not reading: stop reading its requests so it cannot make us buffer answers.
        if self._transport is not None and self._reading and not self._closed:
            self._transport.pause_reading()
            self._reading = False

    def resume_writing(self) -> None:
        if self._transport is not None and not self._reading and not self._closed:
            self._transport.resume_reading()
            self._reading = True

    def data_received(self, data: bytes) -> None:
        self._last_read = self._loop.time()
        if self._partial:
            self._partial.append(data)
            self._partial_size += len(data)
            if self._partial_size < self._partial_needed:
                return
            buffer = b"".join(self._partial)
            self._partial = []
        else:
            buffer = data
        if not self._preface_seen:
            if not (buffer.startswith(PREFACE) or PREFACE.startswith(buffer)):
                self._fail_connection(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return
            if len(buffer) < len(PREFACE):
                self._keep_partial(buffer, len(PREFACE))
                return
            self._preface_seen = True
            self._restart_timer(self._settings.keepalive_time_s)  # the preface deadline is met
            buffer = buffer[len(PREFACE) :]
        self._out = []
        try:
            pos = self._read_frames(buffer)
        except Http2Error as error:
            self._flush_out()
            self._fail_connection(error.code, str(error))
            return
        except Exception:
            logger.exception("unexpected error on an HTTP/2 connection")
            self._flush_out()
            self._fail_connection(ErrorCode.INTERNAL_ERROR, "internal error")
            return
        if pos < len(buffer):
            rest = buffer[pos:]
            length = (rest[0] << 16 | rest[1] << 8 | rest[2]) if len(rest) >= 9 else 0
            self._keep_partial(rest, 9 + length)
        self._flush_out()

    def _keep_partial(self, rest: bytes, needed: int) -> None:
        self._partial = [rest]
        self._partial_size = len(rest)
        self._partial_needed = needed

    # -- reading ----------------------------------------------------------------------
    def _read_frames(self, buffer: bytes) -> int:
        pos = 0
        view = memoryview(buffer)
        end = len(buffer)
        unpack = FRAME_HEADER.unpack_from
        while end - pos >= 9 and not self._closed:
            high, low, kind, flags, stream_id = unpack(buffer, pos)
            length = (high << 8) | low
            if length > _MAX_FRAME_SIZE:
                raise Http2Error(ErrorCode.FRAME_SIZE_ERROR, f"frame of {length} bytes")
            stop = pos + 9 + length
            if stop > end:
                break
            self._frame(kind, flags, stream_id & 0x7FFF_FFFF, view[pos + 9 : stop])
            pos = stop
        return pos

    def _frame(self, kind: int, flags: int, stream_id: int, payload: memoryview) -> None:
        if self._headers_in_progress is not None:
            self._continuation(kind, flags, stream_id, payload)
        elif kind == FrameType.DATA:
            self._data(flags, stream_id, payload)
        elif kind == FrameType.HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == FrameType.WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == FrameType.PING:
            self._ping(flags, stream_id, payload)
        elif kind == FrameType.SETTINGS:
            self._peer_settings(flags, stream_id, payload)
        elif kind == FrameType.RST_STREAM:
            self._rst_stream(stream_id, payload)
        elif kind == FrameType.GOAWAY:
            if stream_id != 0:
                raise Http2Error(ErrorCode.PROTOCOL_ERROR, "GOAWAY on a stream")
            if len(payload) < 8:
                raise Http2Error(ErrorCode.FRAME_SIZE_ERROR, "GOAWAY too short")
            self._going_away = True
            self._close_if_done()
        elif kind == FrameType.PRIORITY:
            if stream_id == 0:
                raise Http2Error(ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(payload) != 5:
                self._reset(stream_id, ErrorCode.FRAME_SIZE_ERROR)
        elif kind in (FrameType.PUSH_PROMISE, FrameType.CONTINUATION):
            raise Http2Error(ErrorCode.PROTOCOL_ERROR, f"unexpected {FrameType(kind).name}")
        # Unknown frame types are ignored (RFC 9113 5.5).

    def _data(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise Http2Error(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self._recv_window -= size
        if self._recv_window < 0:
            raise Http2Error(ErrorCode.FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        self._recv_unacked += size
        if self._recv_unacked >= self._connection_window // 2:
            self.write(window_update_frame(0, self._recv_unacked))
            self._recv_window += self._recv_unacked
            self._recv_unacked = 0
        if flags & Flag.PADDED:
            payload = unpad(payload)
        call = self._streams.get(stream_id)
        if call is None:
            if stream_id > self._last_stream_id:
                raise Http2Error(ErrorCode.PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream already ended or reset: the frame was in flight
        if call.remote_closed:
            self._reset(stream_id, ErrorCode.STREAM_CLOSED)
            return
        call.recv_window -= size
        if call.recv_window < 0:
            self._reset(stream_id, ErrorCode.FLOW_CONTROL_ERROR)
            return
        end_stream = bool(flags & Flag.END_STREAM)
        self._receive(call, payload, end_stream)
        if end_stream:
            self._remote_done(call)
        else:
            self.grant(call)

    def _receive(self, call: GrpcCall, payload: memoryview, end_stream: bool) -> None:
        """Hand request bytes to the call, holding the connection to its memory bound."""
        call.receive(payload, end_stream)
        self._recount(call)
        if self._held > self._max_held and call.held:
            call.fail(
                GrpcAbort(StatusCode.RESOURCE_EXHAUSTED, "too much request data held on this connection")
            )

    def _recount(self, call: GrpcCall) -> None:
        if call.held != call.counted_held and self._streams.get(call.stream_id) is call:
            self._held += call.held - call.counted_held
            call.counted_held = call.held

    def grant(self, call: GrpcCall) -> None:
        """Open the stream's receive window again, unless its handler is behind.

        A handler that has not taken the messages it has, or whose answers wait for the
        client's window, gets no more: flow control, not memory, makes the client wait.
        """
        if (
            call.remote_closed
            or call.recv_window >= _STREAM_WINDOW // 2
            or call.backlogged
            or call.outbound_bytes > _STREAM_WINDOW
            or self._streams.get(call.stream_id) is not call
        ):
            return
        self.write(window_update_frame(call.stream_id, _STREAM_WINDOW - call.recv_window))
        call.recv_window = _STREAM_WINDOW

    def _headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0 or stream_id % 2 == 0:
            raise Http2Error(ErrorCode.PROTOCOL_ERROR, f"HEADERS on stream {stream_id}")
        if flags & Flag.PADDED:
            payload = unpad(payload)
        if flags & Flag.PRIORITY:
            payload = payload[5:]
        if flags & Flag.END_HEADERS:
            self._header_block(flags, stream_id, bytes(payload))
        else:
            self._headers_in_progress = _OpenHeaderBlock(stream_id, flags, [bytes(payload)], len(payload))

    def _continuation(self, kind: int, flags: int, stream_id: int, payload: memoryview) -> None:
        block = self._headers_in_progress
        assert block is not None
        if kind != FrameType.CONTINUATION or stream_id != block.stream_id:
            raise Http2Error(ErrorCode.PROTOCOL_ERROR, "a header block was interrupted")
        block.continuations += 1
        if block.continuations > MAX_CONTINUATION_FRAMES:
            raise Http2Error(ErrorCode.ENHANCE_YOUR_CALM, "too many CONTINUATION frames")
        block.size += len(payload)
        if block.size > 2 * self._settings.max_header_list_bytes:
            raise Http2Error(ErrorCode.ENHANCE_YOUR_CALM, "header block too large")
        block.parts.append(bytes(payload))
        if flags & Flag.END_HEADERS:
            self._headers_in_progress = None
            self._header_block(block.flags, stream_id, b"".join(block.parts))

    def _header_block(self, flags: int, stream_id: int, block: bytes) -> None:
        end_stream = bool(flags & Flag.END_STREAM)
        call = self._streams.get(stream_id)
        if call is not None or stream_id <= self._last_stream_id:
            self._discard_block(block)
            if call is None:
                self._reset(stream_id, ErrorCode.STREAM_CLOSED)
            elif not end_stream or call.remote_closed:  # trailers must end the stream
                self._reset(stream_id, ErrorCode.PROTOCOL_ERROR)
            else:
                self._receive(call, memoryview(b""), True)
                self._remote_done(call)
            return
        self._last_stream_id = stream_id
        if self._going_away or len(self._streams) >= self._settings.max_concurrent_streams:
            self._discard_block(block)
            self._reset(stream_id, ErrorCode.REFUSED_STREAM)
            return
        try:
            head = self._decoder.decode(block)
        except HeaderError as exc:
            raise Http2Error(ErrorCode.COMPRESSION_ERROR, str(exc)) from None
        except MalformedRequest:
            self._reset(stream_id, ErrorCode.PROTOCOL_ERROR)
            return
        self._open(stream_id, head, end_stream)

    def _discard_block(self, block: bytes) -> None:
        try:
            self._decoder.decode_and_discard(block)
        except HeaderError as exc:
            raise Http2Error(ErrorCode.COMPRESSION_ERROR, str(exc)) from None

    def _open(self, stream_id: int, head: RequestHead, end_stream: bool) -> None:
        """Answer what cannot be a call at once; otherwise start the call."""
        self._pings.forgive()
        refusal = head.refusal()
        rpc = self._routes.get(head.path) if refusal is None else None
        if rpc is None:
            if refusal is None:
                refusal = (200, StatusCode.UNIMPLEMENTED, f"unknown method {head.path}")
            status, code, message = refusal
            block = trailers_only(code, message, http_status=status)
            self.write(header_frames(stream_id, block, True, self._outbound.max_frame))
            if not end_stream:
                self.write(rst_stream_frame(stream_id, ErrorCode.NO_ERROR))
            return
        call = GrpcCall(
            self._outbound,
            stream_id,
            head,
            rpc,
            self._loop,
            self._settings.max_message_bytes,
            self._outbound.initial_window,
            _STREAM_WINDOW,
        )
        self._streams[stream_id] = call
        call.start()
        if end_stream:
            self._receive(call, memoryview(b""), True)
            self._remote_done(call)

    def _window_update(self, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise Http2Error(ErrorCode.FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size")
        increment = _U32.unpack(payload)[0] & 0x7FFF_FFFF
        if stream_id == 0:
            if increment == 0:
                raise Http2Error(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._outbound.grow_connection_window(increment)
            return
        call = self._streams.get(stream_id)
        if call is None:
            if stream_id > self._last_stream_id:
                raise Http2Error(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            return
        if increment == 0:
            self._reset(stream_id, ErrorCode.PROTOCOL_ERROR)
            return
        if not self._outbound.grow_stream_window(call, increment):
            self._reset(stream_id, ErrorCode.FLOW_CONTROL_ERROR)

    def _ping(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id != 0:
            raise Http2Error(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise Http2Error(ErrorCode.FRAME_SIZE_ERROR, "PING of the wrong size")
        if flags & Flag.ACK:
            self._keepalive.acknowledged()
            return
        if self._pings.ping(self._loop.time(), bool(self._streams)):
            raise Http2Error(ErrorCode.ENHANCE_YOUR_CALM, "too_many_pings")
        self.write(frame(FrameType.PING, Flag.ACK, 0, bytes(payload)))

    def _peer_settings(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id != 0:
            raise Http2Error(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & Flag.ACK:
            if payload:
                raise Http2Error(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise Http2Error(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS of the wrong size")
        grown = False
        for offset in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HL", payload, offset)
            grown = self._apply_setting(key, value) or grown
        # The ACK goes first: the peer counts on the new values only once it has it.
        self.write(frame(FrameType.SETTINGS, Flag.ACK, 0))
        if grown:
            for call in list(self._streams.values()):
                self._outbound.flush(call)

    def _apply_setting(self, key: int, value: int) -> bool:
        """Apply one setting; True when stream send windows grew."""
        if key == Setting.INITIAL_WINDOW_SIZE:
            return self._outbound.set_initial_window(value, self._streams.values())
        if key == Setting.MAX_FRAME_SIZE:
            if not DEFAULT_MAX_FRAME_SIZE <= value <= 16_777_215:
                raise Http2Error(ErrorCode.PROTOCOL_ERROR, "MAX_FRAME_SIZE out of range")
            self._outbound.max_frame = value
        elif key == Setting.ENABLE_PUSH and value > 1:
            raise Http2Error(ErrorCode.PROTOCOL_ERROR, "ENABLE_PUSH must be 0 or 1")
        # HEADER_TABLE_SIZE: our answers never index headers. Others do not concern a server.
        return False

    def _rst_stream(self, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise Http2Error(ErrorCode.FRAME_SIZE_ERROR, "RST_STREAM of the wrong size")
        if stream_id == 0 or stream_id > self._last_stream_id:
            raise Http2Error(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        call = self._streams.pop(stream_id, None)
        if call is not None:
            self._held -= call.counted_held
            self._outbound.forget(call)
            call.cancel()
            self._charge_reset()
            self._close_if_done()

    def _charge_reset(self) -> None:
        if self._resets.charge(self._loop.time()):
            raise Http2Error(ErrorCode.ENHANCE_YOUR_CALM, "too many stream resets")

    # -- streams and writing (StreamOwner) ---------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def local_done(self, call: GrpcCall) -> None:
        """Our side of the stream ended; a client still sending is told to stop."""
        if not call.remote_closed:
            self.write(rst_stream_frame(call.stream_id, ErrorCode.NO_ERROR))
            call.remote_closed = True
        self._forget(call)

    def _remote_done(self, call: GrpcCall) -> None:
        if call.local_closed and not call.outbound:
            self._forget(call)

    def _forget(self, call: GrpcCall) -> None:
        if self._streams.pop(call.stream_id, None) is not None:
            self._held -= call.counted_held
            self._close_if_done()

    def _reset(self, stream_id: int, code: ErrorCode) -> None:
        """Reset a stream the client got wrong; that counts against its reset budget too."""
        self._charge_reset()
        call = self._streams.pop(stream_id, None)
        if call is not None:
            self._held -= call.counted_held
            self._outbound.forget(call)
            call.cancel()
        self.write(rst_stream_frame(stream_id, code))
        self._close_if_done()

    def write(self, data: bytes) -> None:
        if self._out is not None:
            self._out.append(data)
        elif self._transport is not None and not self._closed:
            self._transport.write(data)

    def write_many(self, chunks: list[bytes | memoryview]) -> None:
        if self._out is not None:
            self._out.extend(chunks)
        elif self._transport is not None and not self._closed:
            self._transport.writelines(chunks)

    def _flush_out(self) -> None:
        out, self._out = self._out, None
        if out and self._transport is not None and not self._closed:
            self._transport.writelines(out)

    # -- lifecycle --------------------------------------------------------------------
    def _fail_connection(self, code: ErrorCode, message: str) -> None:
        logger.debug("closing an HTTP/2 connection: %s (%s)", message, code.name)
        if self._transport is not None and not self._closed:
            self._transport.write(goaway_frame(self._last_stream_id, code, message.encode()[:256]))
            self._closed = True
            self._transport.close()
        for call in list(self._streams.values()):
            call.cancel()
        self._streams.clear()

    def go_away(self) -> None:
        """Shutdown: take no new calls, finish the ones in flight, then close."""
        if self._closed or self._transport is None:
            return
        self._going_away = True
        self.write(goaway_frame(self._last_stream_id, ErrorCode.NO_ERROR))
        for call in list(self._streams.values()):
            call.stop_reading()
        self._close_if_done()

    def abort(self) -> None:
        """Shutdown grace ran out: end every call and drop the connection."""
        for call in list(self._streams.values()):
            call.fail(GrpcAbort(StatusCode.UNAVAILABLE, "the server is shutting down"))
            call.cancel()
        if self._transport is not None and not self._closed:
            self._closed = True
            self._transport.abort()

    def _close_if_done(self) -> None:
        if self._going_away and not self._streams and self._transport is not None and not self._closed:
            out, self._out = self._out, ([] if self._out is not None else None)
            if out:
                self._transport.writelines(out)
            self._closed = True
            self._transport.close()

    def _restart_timer(self, delay: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        """Preface deadline, then keepalive: ping a quiet peer, drop one that does not answer."""
        self._timer = None
        if self._closed or self._transport is None:
            return
        if not self._preface_seen:
            self._fail_connection(ErrorCode.PROTOCOL_ERROR, "no connection preface")
            return
        step, delay = self._keepalive.step(self._loop.time(), self._last_read)
        if step is KeepaliveStep.CLOSE:
            self._fail_connection(ErrorCode.NO_ERROR, "keepalive ping not answered")
            return
        if step is KeepaliveStep.PING:
            self._transport.write(frame(FrameType.PING, 0, 0, os.urandom(8)))
        self._timer = self._loop.call_later(delay, self._on_timer)
