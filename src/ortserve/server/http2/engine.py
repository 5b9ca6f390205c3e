"""The server side of one HTTP/2 connection as a state machine without I/O (RFC 9113, prior knowledge).

Bytes go in through :meth:`Http2Engine.receive_data`, which answers with events (a request
head, request data, a reset, the end of the connection); the application answers through
``send_*`` calls; the bytes to write come out of :meth:`Http2Engine.data_to_send`, in one
list per read so they can leave in one system call. Timers are the application's: it calls
:meth:`Http2Engine.tick` when the delay the previous tick returned has passed. The clock is
passed in, so tests drive time by hand.

The engine owns the preface, frame parsing, request header blocks (assembled by
:mod:`~ortserve.server.http2.header_block`, decoded through :mod:`~ortserve.server.http2.headers`),
DATA and receive flow control (the connection window is credited as data arrives; a stream's
window reopens only once the application has consumed what it was given and its answers are not
piling up), and its timers. Its base classes hold the rest of the same object: the control
frames and guards (:mod:`~ortserve.server.http2.control`) and the stream table with the
application's calls (:mod:`~ortserve.server.http2.streams`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ortserve.server.http2.config import EngineConfig
from ortserve.server.http2.control import ControlFrames
from ortserve.server.http2.events import ConnectionEnded, DataReceived, Event, RequestReceived
from ortserve.server.http2.frames import (
    FRAME_HEADER,
    PREFACE,
    ErrorCode,
    Flag,
    FrameType,
    Http2Error,
    frame,
    goaway_frame,
    unpad,
)
from ortserve.server.http2.guards import KeepaliveStep
from ortserve.server.http2.header_block import SELF_DEPENDENT, OpenHeaderBlock, head_fragment
from ortserve.server.http2.headers import Fields, HeaderBlockDecoder, HeaderError, MalformedHeaders
from ortserve.server.http2.stream import Stream

__all__ = ["Http2Engine"]

_H = TypeVar("_H")
_EMPTY = memoryview(b"")
# Plain ints for the per-frame tests: an enum member is a global and an attribute lookup each time.
_DATA = int(FrameType.DATA)
_HEADERS = int(FrameType.HEADERS)
_END_STREAM = Flag.END_STREAM
_END_HEADERS = Flag.END_HEADERS
_PADDED = Flag.PADDED
# HEADERS flags of the common request head: END_HEADERS, without PADDED or PRIORITY.
_PLAIN_HEAD_MASK = Flag.END_HEADERS | Flag.PADDED | Flag.PRIORITY


class Http2Engine(ControlFrames[_H]):
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
        self._started = clock()
        super().__init__(config, self._started)
        self._clock = clock
        # The config's figures read on every frame, kept as plain attributes.
        self._max_streams = config.max_concurrent_streams
        self._stream_window = config.stream_window
        self._max_block = 2 * config.max_header_list_bytes
        self._decoder = HeaderBlockDecoder(config.max_header_list_bytes, interpret)
        # Bytes of an incomplete frame, kept as a list and joined once the frame is whole, so a
        # large frame arriving in many reads is copied once rather than once per read.
        self._partial: list[bytes] = []
        self._partial_size = 0
        self._partial_needed = 0
        self._preface_seen = False
        self._open_block: OpenHeaderBlock | None = None
        self._pings_sent = 0
        self._unfinished_since: float | None = None
        """When the frame or header block still unfinished began to arrive (None: none is)."""

    @property
    def buffered_bytes(self) -> int:
        """Bytes the engine holds for the peer: a partial frame, an open header block, answers
        waiting for window, and bytes not yet taken by :meth:`data_to_send`."""
        block = 0 if self._open_block is None else self._open_block.size
        return self._partial_size + block + self._out.waiting

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
        if not self._partial and self._open_block is None:
            self._unfinished_since = None
        elif self._unfinished_since is None:
            self._unfinished_since = self._last_read
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
            # Each kind of frame goes straight to its handler, a unary call's DATA and plain
            # HEADERS included: one call per frame on the path every request takes.
            if self._open_block is not None:
                open_block = self._open_block
                block = open_block.add(kind, flags, stream_id, view[pos + 9 : stop])
                if block is not None:
                    self._open_block = None
                    self._header_block(open_block.flags, stream_id, block)
            elif kind == _DATA:
                self._data(flags, stream_id, view[pos + 9 : stop])
            elif kind == _HEADERS and flags & _PLAIN_HEAD_MASK == _END_HEADERS and stream_id & 1:
                self._header_block(flags, stream_id, buffer[pos + 9 : stop])
            elif kind == _HEADERS:
                self._headers(flags, stream_id, view[pos + 9 : stop])
            else:
                self._frame(kind, flags, stream_id, view[pos + 9 : stop])
            pos = stop
            if self.closed:  # a graceful end completed inside this read
                return end
        return pos

    def _data(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise Http2Error(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self._recv_window -= size
        if self._recv_window < 0:
            raise Http2Error(ErrorCode.FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        self._recv_unacked += size
        if self._recv_unacked >= self._window_refresh:
            self.credit_connection()
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
        stream.request_bytes += size
        if flags & _END_STREAM:
            stream.remote_closed = True
            self.awaiting.pop(stream_id, None)
            self._events.append(DataReceived(stream_id, payload, True))
            if stream.local_closed and not stream.outbound:
                self._forget(stream)
        elif payload:
            stream.unconsumed = True
            self._events.append(DataReceived(stream_id, payload, False))

    def _headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        """A HEADERS frame with padding or priority, or one a CONTINUATION frame must finish."""
        flags, fragment = head_fragment(flags, stream_id, payload)
        if flags & Flag.END_HEADERS:
            self._header_block(flags, stream_id, bytes(fragment))
        else:
            self._open_block = OpenHeaderBlock(stream_id, flags, bytes(fragment), self._config)

    def _header_block(self, flags: int, stream_id: int, block: bytes) -> None:
        # The bound an assembled block keeps as it grows (OpenHeaderBlock), for a block of one
        # frame too: a single HEADERS frame may be as large as a frame (1 MiB), and HPACK
        # instructions that add no field (table size updates) cost the decoder time without
        # counting against the header list's size.
        if len(block) > self._max_block:
            raise Http2Error(ErrorCode.ENHANCE_YOUR_CALM, "header block too large")
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
        if flags & SELF_DEPENDENT:  # a stream cannot depend on itself (5.3.1): a stream error
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
        if not end_stream:
            stream.request_since = self._last_read
            self.awaiting[stream_id] = stream
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
            self.awaiting.pop(stream_id, None)
            self._events.append(DataReceived(stream_id, _EMPTY, True))
            self._remote_done(stream)

    def _discard_block(self, block: bytes) -> None:
        try:
            self._decoder.decode_and_discard(block)
        except HeaderError as exc:
            raise Http2Error(ErrorCode.COMPRESSION_ERROR, f"header block not decodable: {exc}") from None

    # -- the application's side -----------------------------------------------------------
    def close(self, code: ErrorCode, message: str) -> None:
        """End the connection now with GOAWAY ``code`` (the application's own failure)."""
        if not self.closed:
            self._fail(code, message)

    def tick(self, requests_timed: bool = True) -> float | None:
        """Timers: the preface deadline, a frame or header block left unfinished, then keepalive
        (ping a quiet peer, drop one that does not answer). Returns the seconds until the next
        tick (at most ``frame_timeout_s``: a frame may be begun at any time; sooner when a
        request's arrival deadline, :meth:`expired_requests`, comes first, unless
        ``requests_timed`` is False: while the application does not read, the requests' clocks
        stand still, :meth:`postpone_requests`, and a deadline already past would otherwise
        bring the next tick every millisecond), or None once the connection is over."""
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
        since = self._unfinished_since
        if since is not None and now - since >= config.frame_timeout_s:
            # Half a frame, then nothing (or a byte now and then): the connection would be held
            # until keepalive gives up (two hours), and a connection that has spoken is never
            # evicted for a new one.
            self._fail(ErrorCode.NO_ERROR, "a frame was left unfinished")
            return None
        step, delay = self._keepalive.step(now, self._last_read)
        if step is KeepaliveStep.CLOSE:
            self._fail(ErrorCode.NO_ERROR, "keepalive ping not answered")
            return None
        if step is KeepaliveStep.PING:
            self._pings_sent += 1
            self._out.write(frame(FrameType.PING, 0, 0, self._pings_sent.to_bytes(8, "big")))
        if since is not None:
            delay = min(delay, since + config.frame_timeout_s - now)
        else:
            delay = min(delay, config.frame_timeout_s)
        if self.awaiting and requests_timed:
            delay = min(delay, max(min(map(self._request_due, self.awaiting.values())) - now, 0.001))
        return delay

    # -- requests arriving -------------------------------------------------------------------
    def _request_due(self, stream: Stream) -> float:
        """When the stream's request must have ended: the grace plus a second per
        ``request_min_rate`` bytes received, within ``request_timeout_s`` of its opening."""
        config = self._config
        due = stream.request_since + config.request_grace_s + stream.request_bytes / config.request_min_rate
        return min(due, stream.request_since + config.request_timeout_s)

    def expired_requests(self) -> list[int]:
        """Streams whose request missed its arrival deadline (each reported once; the
        application ends them). The engine's timer covers these deadlines (:meth:`tick`)."""
        now = self._clock()
        late = [sid for sid, stream in self.awaiting.items() if self._request_due(stream) <= now]
        for stream_id in late:
            del self.awaiting[stream_id]
        return late

    def postpone_requests(self, seconds: float) -> None:
        """The application stopped reading for ``seconds`` (the loop was saturated): the peer
        could not send, so its requests' clocks skip that time."""
        for stream in self.awaiting.values():
            stream.request_since += seconds

    def _fail(self, code: ErrorCode, message: str) -> None:
        self._out.write(goaway_frame(self._last_stream_id, code, message))
        self.closed = True
        self._streams.clear()
        self.awaiting.clear()
        self._out.clear()
        self._open_block = None
        self._partial = []
        self._partial_size = 0
