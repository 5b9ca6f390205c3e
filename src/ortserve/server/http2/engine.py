"""The server side of one HTTP/2 connection as a state machine without I/O (RFC 9113, prior knowledge).

Bytes go in through :meth:`Http2Engine.receive_data`, which answers with events (a request
head, request data, a reset, the end of the connection); the application answers through
``send_*`` calls; the bytes to write come out of :meth:`Http2Engine.data_to_send`, in one
list per read so they can leave in one system call. Timers are the application's: it calls
:meth:`Http2Engine.tick` when the delay the previous tick returned has passed. The clock is
passed in, so tests drive time by hand.

The engine owns the preface, frame parsing, header blocks (HPACK through
:mod:`~ortserve.server.http2.headers`), the stream table and states, receive flow control (the
connection window is credited as data arrives; a stream's window reopens only once the
application has consumed what it was given and its answers are not piling up), SETTINGS,
PING, RST_STREAM, GOAWAY, and the guards of :mod:`~ortserve.server.http2.guards`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from ortserve.server.http2.config import EngineConfig
from ortserve.server.http2.events import ConnectionEnded, DataReceived, Event, RequestReceived, StreamReset
from ortserve.server.http2.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_WINDOW,
    FRAME_HEADER,
    PREFACE,
    ErrorCode,
    Flag,
    FrameType,
    Http2Error,
    Setting,
    frame,
    goaway_frame,
    rst_stream_frame,
    settings_frame,
    unpad,
    window_update_frame,
)
from ortserve.server.http2.guards import Keepalive, KeepaliveStep, PingStrikes, ResetBudget
from ortserve.server.http2.headers import Fields, HeaderBlockDecoder, HeaderError, MalformedHeaders
from ortserve.server.http2.outbound import Outbound
from ortserve.server.http2.stream import Stream

__all__ = ["Http2Engine"]

_H = TypeVar("_H")
_U32 = struct.Struct(">L")
_SETTING = struct.Struct(">HL")
_EMPTY = memoryview(b"")
_SELF_DEPENDENT = 0x100  # not a wire flag: marks a HEADERS frame whose priority names its own stream
# Plain ints for the per-frame tests: an enum member is a global and an attribute lookup each time.
_DATA = int(FrameType.DATA)
_HEADERS = int(FrameType.HEADERS)
_END_STREAM = Flag.END_STREAM
_END_HEADERS = Flag.END_HEADERS
_PADDED = Flag.PADDED
# HEADERS flags of the common request head: END_HEADERS, without PADDED or PRIORITY.
_PLAIN_HEAD_MASK = Flag.END_HEADERS | Flag.PADDED | Flag.PRIORITY


@dataclass(slots=True)
class _OpenHeaderBlock:
    stream_id: int
    flags: int
    parts: list[bytes]
    size: int
    continuations: int = 0


class Http2Engine(Generic[_H]):
    """One server-side HTTP/2 connection, bytes in, events and bytes out.

    Args:
        config: limits and timers.
        interpret: turns a request's checked header fields into the application's head (pure;
            cached per header block); may raise
            :class:`~ortserve.server.http2.headers.MalformedHeaders`.
        clock: monotonic seconds.
    """

    def __init__(
        self, config: EngineConfig, interpret: Callable[[Fields], _H], clock: Callable[[], float]
    ) -> None:
        self._config = config
        self._clock = clock
        # The config's figures read on every frame, kept as plain attributes.
        self._max_streams = config.max_concurrent_streams
        self._stream_window = config.stream_window
        self._window_refresh = config.connection_window // 2
        self._decoder = HeaderBlockDecoder(config.max_header_list_bytes, interpret)
        # Bytes of an incomplete frame, kept as a list and joined once the frame is whole, so a
        # large frame arriving in many reads is copied once rather than once per read.
        self._partial: list[bytes] = []
        self._partial_size = 0
        self._partial_needed = 0
        self._preface_seen = False
        self._streams: dict[int, Stream] = {}
        self._last_stream_id = 0
        self._open_block: _OpenHeaderBlock | None = None
        self._events: list[Event[_H]] = []
        self.closed = False
        """The connection is over: send what :meth:`data_to_send` has, then close the transport.
        (An attribute, not a property: it is read after every read and every answer.)"""
        self._going_away = False
        self._recv_window = config.connection_window
        self._recv_unacked = 0
        self._out = Outbound(self)
        self._started = clock()
        self._last_read = self._started
        self._keepalive = Keepalive(config.keepalive_time_s, config.keepalive_timeout_s)
        self._pings = PingStrikes()
        self._resets = ResetBudget()
        self._pings_sent = 0

    # -- state --------------------------------------------------------------------------
    @property
    def open_streams(self) -> int:
        """Streams open or half-closed."""
        return len(self._streams)

    @property
    def last_stream_id(self) -> int:
        """The highest stream id the peer has used: streams above it are idle, below it closed
        unless open."""
        return self._last_stream_id

    @property
    def open_stream_ids(self) -> frozenset[int]:
        """Ids of the streams open or half-closed."""
        return frozenset(self._streams)

    @property
    def buffered_bytes(self) -> int:
        """Bytes the engine holds for the peer: a partial frame, an open header block, answers
        waiting for window, and bytes not yet taken by :meth:`data_to_send`."""
        block = 0 if self._open_block is None else self._open_block.size
        waiting = sum(stream.outbound_bytes for stream in self._streams.values())
        return self._partial_size + block + waiting

    def initiate(self) -> None:
        """Queue our SETTINGS and the connection window's growth (the connection just opened)."""
        config = self._config
        settings = {
            Setting.MAX_CONCURRENT_STREAMS: config.max_concurrent_streams,
            Setting.INITIAL_WINDOW_SIZE: config.stream_window,
            Setting.MAX_FRAME_SIZE: config.max_frame_size,
            Setting.MAX_HEADER_LIST_SIZE: config.max_header_list_bytes,
            Setting.ENABLE_PUSH: 0,
        }
        self._out.write(settings_frame(settings))
        if config.connection_window > DEFAULT_WINDOW:
            self._out.write(window_update_frame(0, config.connection_window - DEFAULT_WINDOW))

    def data_to_send(self) -> list[bytes | memoryview]:
        """Bytes to write, in order; empty when there are none."""
        out = self._out.out
        if out:
            self._out.out = []
        return out

    # -- reading ------------------------------------------------------------------------
    def receive_data(self, data: bytes) -> list[Event[_H]]:
        """Handle bytes read from the peer; returns what happened, in order.

        Nothing is raised for anything the peer sends: a connection error becomes GOAWAY in
        :meth:`data_to_send` and a :class:`ConnectionEnded` event.
        """
        if self.closed:
            return []
        self._last_read = self._clock()
        if self._partial:
            self._partial.append(data)
            self._partial_size += len(data)
            if self._partial_size < self._partial_needed:
                return []
            buffer = b"".join(self._partial)
            self._partial = []
            self._partial_size = 0
        else:
            buffer = data
        events: list[Event[_H]] = []
        self._events = events
        try:
            if not self._preface_seen:
                if not (buffer.startswith(PREFACE) or PREFACE.startswith(buffer)):
                    raise Http2Error(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                if len(buffer) < len(PREFACE):
                    self._keep_partial(buffer, len(PREFACE))
                    return events
                self._preface_seen = True
                buffer = buffer[len(PREFACE) :]
            pos = self._read_frames(buffer)
        except Http2Error as error:
            self._fail(error.code, str(error))
            events.append(ConnectionEnded(error.code, str(error)))
            return events
        if pos < len(buffer):
            rest = buffer[pos:]
            length = (rest[0] << 16 | rest[1] << 8 | rest[2]) if len(rest) >= 9 else 0
            self._keep_partial(rest, 9 + length)
        return events

    def _keep_partial(self, rest: bytes, needed: int) -> None:
        self._partial = [rest]
        self._partial_size = len(rest)
        self._partial_needed = needed

    def _read_frames(self, buffer: bytes) -> int:
        pos = 0
        view = memoryview(buffer)
        end = len(buffer)
        unpack = FRAME_HEADER.unpack_from
        max_frame = self._config.max_frame_size
        while end - pos >= 9:
            high, low, kind, flags, stream_id = unpack(buffer, pos)
            length = (high << 8) | low
            if length > max_frame:
                raise Http2Error(ErrorCode.FRAME_SIZE_ERROR, f"frame of {length} bytes")
            stop = pos + 9 + length
            if stop > end:
                break
            stream_id &= 0x7FFF_FFFF
            # A unary call's frames, dispatched here rather than through _frame: one call fewer
            # per frame on the path every request takes.
            if self._open_block is not None:
                self._continuation(kind, flags, stream_id, view[pos + 9 : stop])
            elif kind == _DATA:
                self._data(flags, stream_id, view[pos + 9 : stop])
            elif kind == _HEADERS and flags & _PLAIN_HEAD_MASK == _END_HEADERS and stream_id & 1:
                self._header_block(flags, stream_id, buffer[pos + 9 : stop])
            else:
                self._frame(kind, flags, stream_id, view[pos + 9 : stop])
            pos = stop
            if self.closed:  # a graceful end completed inside this read
                return end
        return pos

    def _frame(self, kind: int, flags: int, stream_id: int, payload: memoryview) -> None:
        if self._open_block is not None:
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
            elif _U32.unpack_from(payload)[0] & 0x7FFF_FFFF == stream_id:
                self._reset(stream_id, ErrorCode.PROTOCOL_ERROR)  # depends on itself: 5.3.1
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
        if self._recv_unacked >= self._window_refresh:
            self._out.write(window_update_frame(0, self._recv_unacked))
            self._recv_window += self._recv_unacked
            self._recv_unacked = 0
        if flags & _PADDED:
            payload = unpad(payload)
        stream = self._streams.get(stream_id)
        if stream is None:
            if stream_id > self._last_stream_id:
                raise Http2Error(ErrorCode.PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream already ended or reset: the frame was in flight
        if stream.remote_closed:
            self._reset(stream_id, ErrorCode.STREAM_CLOSED)
            return
        stream.recv_window -= size
        if stream.recv_window < 0:
            self._reset(stream_id, ErrorCode.FLOW_CONTROL_ERROR)
            return
        if flags & _END_STREAM:
            stream.remote_closed = True
            self._events.append(DataReceived(stream_id, payload, True))
            if stream.local_closed and not stream.outbound:
                self._forget(stream)
        elif payload:
            stream.unconsumed = True
            self._events.append(DataReceived(stream_id, payload, False))

    def _headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0 or stream_id % 2 == 0:
            raise Http2Error(ErrorCode.PROTOCOL_ERROR, f"HEADERS on stream {stream_id}")
        if flags & Flag.PADDED:
            payload = unpad(payload)
        if flags & Flag.PRIORITY:
            if len(payload) < 5:
                raise Http2Error(ErrorCode.FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            if _U32.unpack_from(payload)[0] & 0x7FFF_FFFF == stream_id:
                flags |= _SELF_DEPENDENT
            payload = payload[5:]
        if flags & Flag.END_HEADERS:
            self._header_block(flags, stream_id, bytes(payload))
        else:
            self._open_block = _OpenHeaderBlock(stream_id, flags, [bytes(payload)], len(payload))

    def _continuation(self, kind: int, flags: int, stream_id: int, payload: memoryview) -> None:
        block = self._open_block
        assert block is not None
        if kind != FrameType.CONTINUATION or stream_id != block.stream_id:
            raise Http2Error(ErrorCode.PROTOCOL_ERROR, "a header block was interrupted")
        block.continuations += 1
        if block.continuations > self._config.max_continuation_frames:
            raise Http2Error(ErrorCode.ENHANCE_YOUR_CALM, "too many CONTINUATION frames")
        block.size += len(payload)
        if block.size > 2 * self._config.max_header_list_bytes:
            raise Http2Error(ErrorCode.ENHANCE_YOUR_CALM, "header block too large")
        block.parts.append(bytes(payload))
        if flags & Flag.END_HEADERS:
            self._open_block = None
            self._header_block(block.flags, stream_id, b"".join(block.parts))

    def _header_block(self, flags: int, stream_id: int, block: bytes) -> None:
        end_stream = bool(flags & _END_STREAM)
        streams = self._streams
        if stream_id <= self._last_stream_id:
            self._trailers(streams.get(stream_id), stream_id, end_stream, block)
            return
        self._last_stream_id = stream_id
        if self._going_away or len(streams) >= self._max_streams:
            self._discard_block(block)
            self._reset(stream_id, ErrorCode.REFUSED_STREAM)
            return
        if flags & _SELF_DEPENDENT:  # a stream cannot depend on itself (5.3.1): a stream error
            self._discard_block(block)
            self._reset(stream_id, ErrorCode.PROTOCOL_ERROR)
            return
        try:
            head = self._decoder.decode(block)
        except HeaderError as exc:
            raise Http2Error(ErrorCode.COMPRESSION_ERROR, f"header block not decodable: {exc}") from None
        except MalformedHeaders:
            self._reset(stream_id, ErrorCode.PROTOCOL_ERROR)
            return
        if not self._pings.forgiven:
            self._pings.forgive()
        stream = Stream(stream_id, self._out.initial_window, self._stream_window)
        streams[stream_id] = stream
        stream.remote_closed = end_stream
        self._events.append(RequestReceived(stream_id, head, end_stream))

    def _trailers(self, stream: Stream | None, stream_id: int, end_stream: bool, block: bytes) -> None:
        """A header block on a stream already open (trailers) or closed."""
        try:
            malformed = False
            if stream is None or not end_stream or stream.remote_closed:
                self._decoder.decode_and_discard(block)
            else:
                self._decoder.check_trailers(block)
        except HeaderError as exc:
            raise Http2Error(ErrorCode.COMPRESSION_ERROR, f"header block not decodable: {exc}") from None
        except MalformedHeaders:
            malformed = True
        if stream is None or stream.remote_closed:  # closed, or half-closed (remote): 5.1
            self._reset(stream_id, ErrorCode.STREAM_CLOSED)
        elif malformed or not end_stream:  # trailers must end the stream: 8.1
            self._reset(stream_id, ErrorCode.PROTOCOL_ERROR)
        else:
            stream.remote_closed = True
            self._events.append(DataReceived(stream_id, _EMPTY, True))
            self._remote_done(stream)

    def _discard_block(self, block: bytes) -> None:
        try:
            self._decoder.decode_and_discard(block)
        except HeaderError as exc:
            raise Http2Error(ErrorCode.COMPRESSION_ERROR, f"header block not decodable: {exc}") from None

    def _window_update(self, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise Http2Error(ErrorCode.FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size")
        increment = _U32.unpack(payload)[0] & 0x7FFF_FFFF
        if stream_id == 0:
            if increment == 0:
                raise Http2Error(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._out.grow_connection_window(increment)
            return
        stream = self._streams.get(stream_id)
        if stream is None:
            if stream_id > self._last_stream_id:
                raise Http2Error(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            return
        if increment == 0:
            self._reset(stream_id, ErrorCode.PROTOCOL_ERROR)
            return
        if not self._out.grow_stream_window(stream, increment):
            self._reset(stream_id, ErrorCode.FLOW_CONTROL_ERROR)

    def _ping(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id != 0:
            raise Http2Error(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise Http2Error(ErrorCode.FRAME_SIZE_ERROR, "PING of the wrong size")
        if flags & Flag.ACK:
            self._keepalive.acknowledged()
            return
        if self._pings.ping(self._last_read, bool(self._streams)):
            raise Http2Error(ErrorCode.ENHANCE_YOUR_CALM, "too_many_pings")
        self._out.write(frame(FrameType.PING, Flag.ACK, 0, bytes(payload)))

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
            key, value = _SETTING.unpack_from(payload, offset)
            grown = self._apply_setting(key, value) or grown
        # The ACK goes first: the peer counts on the new values only once it has it.
        self._out.write(frame(FrameType.SETTINGS, Flag.ACK, 0))
        if grown:
            for stream in list(self._streams.values()):
                self._out.flush(stream)

    def _apply_setting(self, key: int, value: int) -> bool:
        """Apply one setting; True when stream send windows grew."""
        if key == Setting.INITIAL_WINDOW_SIZE:
            return self._out.set_initial_window(value, self._streams.values())
        if key == Setting.MAX_FRAME_SIZE:
            if not DEFAULT_MAX_FRAME_SIZE <= value <= 16_777_215:
                raise Http2Error(ErrorCode.PROTOCOL_ERROR, "MAX_FRAME_SIZE out of range")
            self._out.max_frame = value
        elif key == Setting.ENABLE_PUSH and value > 1:
            raise Http2Error(ErrorCode.PROTOCOL_ERROR, "ENABLE_PUSH must be 0 or 1")
        # HEADER_TABLE_SIZE: answers never index headers. Others do not concern a server.
        return False

    def _rst_stream(self, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise Http2Error(ErrorCode.FRAME_SIZE_ERROR, "RST_STREAM of the wrong size")
        if stream_id == 0 or stream_id > self._last_stream_id:
            raise Http2Error(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        stream = self._streams.pop(stream_id, None)
        if stream is not None:
            self._out.forget(stream)
            code = _U32.unpack(payload)[0]
            self._events.append(StreamReset(stream_id, _error_code(code), True))
            self._charge_reset()
            self._close_if_done()

    def _charge_reset(self) -> None:
        if self._resets.charge(self._last_read):
            raise Http2Error(ErrorCode.ENHANCE_YOUR_CALM, "too many stream resets")

    def _reset(self, stream_id: int, code: ErrorCode) -> None:
        """Reset a stream the peer got wrong; that counts against its reset budget too."""
        self._charge_reset()
        stream = self._streams.pop(stream_id, None)
        if stream is not None:
            self._out.forget(stream)
            self._events.append(StreamReset(stream_id, code, False))
        self._out.write(rst_stream_frame(stream_id, code))
        self._close_if_done()

    # -- the application's side -----------------------------------------------------------
    def send_response(self, stream_id: int, headers: bytes, payload: bytes, trailers: bytes) -> None:
        """A whole answer of one DATA payload: headers, payload, closing header block.

        Ignored for a stream that is gone (reset, or the connection ended) or already ended.
        """
        stream = self._streams.get(stream_id)
        if (
            stream is not None
            and not stream.local_closed
            and self._out.answer(stream, headers, payload, trailers)
        ):
            # All of it went out at once (the common case): our side is done, as local_done does.
            if not stream.remote_closed:
                self._out.write(rst_stream_frame(stream_id, ErrorCode.NO_ERROR))
                stream.remote_closed = True
            del self._streams[stream_id]
            if self._going_away:
                self._close_if_done()

    def send_headers(self, stream_id: int, block: bytes, end_stream: bool = False) -> None:
        """A header block; ``end_stream`` makes it the last (trailers, or a headers-only answer)."""
        stream = self._streams.get(stream_id)
        if stream is not None and not stream.local_closed:
            self._out.headers(stream, block, end_stream)

    def send_data(self, stream_id: int, payload: bytes | memoryview) -> None:
        """Body bytes, sent as the peer's windows allow (queued until then)."""
        stream = self._streams.get(stream_id)
        if stream is not None and not stream.local_closed:
            self._out.data(stream, payload)

    def reset_stream(self, stream_id: int, code: ErrorCode = ErrorCode.CANCEL) -> None:
        """End a stream abruptly, dropping what it still had to send."""
        stream = self._streams.pop(stream_id, None)
        if stream is None or self.closed:
            return
        self._out.forget(stream)
        self._out.write(rst_stream_frame(stream_id, code))
        self._close_if_done()

    def consumed(self, stream_id: int) -> None:
        """The application took all the data it was given on the stream: the peer may send more."""
        stream = self._streams.get(stream_id)
        if stream is not None:
            stream.unconsumed = False
            self.grant(stream)

    def go_away(self) -> None:
        """Graceful shutdown: refuse new streams, finish the open ones, then close."""
        if self.closed:
            return
        self._going_away = True
        self._out.write(goaway_frame(self._last_stream_id, ErrorCode.NO_ERROR))
        self._close_if_done()

    def close(self, code: ErrorCode, message: str) -> None:
        """End the connection now with GOAWAY ``code`` (the application's own failure)."""
        if not self.closed:
            self._fail(code, message)

    def tick(self) -> float | None:
        """Timers: the preface deadline, then keepalive (ping a quiet peer, drop one that does not
        answer). Returns the seconds until the next tick, or None once the connection is over."""
        if self.closed:
            return None
        now = self._clock()
        config = self._config
        if not self._preface_seen:
            left = self._started + config.preface_timeout_s - now
            if left <= 0:
                self._fail(ErrorCode.PROTOCOL_ERROR, "no connection preface")
                return None
            return min(left, config.keepalive_time_s)
        step, delay = self._keepalive.step(now, self._last_read)
        if step is KeepaliveStep.CLOSE:
            self._fail(ErrorCode.NO_ERROR, "keepalive ping not answered")
            return None
        if step is KeepaliveStep.PING:
            self._pings_sent += 1
            self._out.write(frame(FrameType.PING, 0, 0, self._pings_sent.to_bytes(8, "big")))
        return delay

    # -- SendOwner ------------------------------------------------------------------------
    def grant(self, stream: Stream) -> None:
        """Reopen a stream's receive window, unless the application is behind on it.

        A stream whose data the application has not consumed, or whose answers wait for the
        peer's window, gets no more: flow control, not memory, makes the peer wait.
        """
        window = self._config.stream_window
        if (
            stream.remote_closed
            or stream.unconsumed
            or stream.recv_window >= window // 2
            or stream.outbound_bytes > window
            or self._streams.get(stream.stream_id) is not stream
        ):
            return
        self._out.write(window_update_frame(stream.stream_id, window - stream.recv_window))
        stream.recv_window = window

    def local_done(self, stream: Stream) -> None:
        """Our side of the stream ended; a peer still sending is told to stop."""
        if not stream.remote_closed:
            self._out.write(rst_stream_frame(stream.stream_id, ErrorCode.NO_ERROR))
            stream.remote_closed = True
        self._forget(stream)

    def _remote_done(self, stream: Stream) -> None:
        if stream.local_closed and not stream.outbound:
            self._forget(stream)

    def _forget(self, stream: Stream) -> None:
        if self._streams.pop(stream.stream_id, None) is not None and self._going_away:
            self._close_if_done()

    def _close_if_done(self) -> None:
        if self._going_away and not self._streams and not self.closed:
            self.closed = True

    def _fail(self, code: ErrorCode, message: str) -> None:
        self._out.write(goaway_frame(self._last_stream_id, code, message))
        self.closed = True
        self._streams.clear()
        self._out.clear()
        self._open_block = None
        self._partial = []
        self._partial_size = 0


def _error_code(code: int) -> ErrorCode:
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.INTERNAL_ERROR  # unknown codes mean INTERNAL_ERROR (RFC 9113 7)
