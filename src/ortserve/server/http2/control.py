"""The engine's connection-control frames: our SETTINGS, and the peer's SETTINGS, PING,
WINDOW_UPDATE, RST_STREAM, GOAWAY and PRIORITY, with the guards they answer to (ping strikes,
the stream-reset budget, keepalive's acknowledgements) and the stream errors the engine answers
with RST_STREAM.

:class:`ControlFrames` sits between :class:`~ortserve.server.http2.streams.StreamTable` and
:class:`~ortserve.server.http2.engine.Http2Engine` as a base class, so the engine's frame loop
reaches these handlers as its own methods: no call is added per frame.
"""

from __future__ import annotations

import struct
from typing import TypeVar

from ortserve.server.http2.config import EngineConfig
from ortserve.server.http2.events import StreamReset
from ortserve.server.http2.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_WINDOW,
    MAX_WINDOW,
    ErrorCode,
    Flag,
    FrameType,
    Http2Error,
    Setting,
    frame,
    rst_stream_frame,
    settings_frame,
    window_update_frame,
)
from ortserve.server.http2.guards import FrameBudget, Keepalive, PingStrikes
from ortserve.server.http2.streams import StreamTable

__all__ = ["ControlFrames"]

_H = TypeVar("_H")
_U32 = struct.Struct(">L")
_SETTING = struct.Struct(">HL")
_SETTINGS_PER_S = 20.0
_SETTINGS_BURST = 100.0
"""A peer's SETTINGS frames: clients send one at the start and a few more at most (gRPC's
window tuning); a hundred at once and twenty a second after that is far beyond any."""


class ControlFrames(StreamTable[_H]):
    """Connection-level frames and the guards on what a peer may make the connection do.

    Args:
        config: limits and timers.
        now: the connection's start, on the engine's clock (the last read until there is one).
    """

    def __init__(self, config: EngineConfig, now: float) -> None:
        super().__init__(config)
        self._last_read = now
        self._keepalive = Keepalive(config.keepalive_time_s, config.keepalive_timeout_s)
        self._pings = PingStrikes()
        self._resets = FrameBudget()
        self._settings = FrameBudget(rate=_SETTINGS_PER_S, burst=_SETTINGS_BURST)
        self.peer_resets = 0
        """Open streams the peer has reset, over the connection's life: an application that
        sees it change during a read knows some of the read's streams may be gone already."""

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

    # -- the peer's frames ----------------------------------------------------------------
    def _frame(self, kind: int, flags: int, stream_id: int, payload: memoryview) -> None:
        """Every frame but DATA and HEADERS, outside a header block (the engine's loop takes
        those itself)."""
        if kind == FrameType.WINDOW_UPDATE:
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
        if self._settings.charge(self._last_read):
            raise Http2Error(ErrorCode.ENHANCE_YOUR_CALM, "too many SETTINGS frames")
        # Every entry is checked, but the streams are walked once per frame, with the last
        # INITIAL_WINDOW_SIZE: a frame may repeat it 170,000 times (a megabyte), and walking
        # 100 streams for each entry made a frame cost O(entries x streams).
        window: int | None = None
        for offset in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == Setting.INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise Http2Error(ErrorCode.FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE too large")
                window = value
            else:
                self._apply_setting(key, value)
        grown = window is not None and self._out.set_initial_window(window, self._streams.values())
        # The ACK goes first: the peer counts on the new values only once it has it.
        self._out.write(frame(FrameType.SETTINGS, Flag.ACK, 0))
        if grown:
            self._out.flush_starved()
            self._out.flush_blocked()

    def _apply_setting(self, key: int, value: int) -> None:
        """Apply one setting other than INITIAL_WINDOW_SIZE."""
        if key == Setting.MAX_FRAME_SIZE:
            if not DEFAULT_MAX_FRAME_SIZE <= value <= 16_777_215:
                raise Http2Error(ErrorCode.PROTOCOL_ERROR, "MAX_FRAME_SIZE out of range")
            self._out.max_frame = value
        elif key == Setting.ENABLE_PUSH and value > 1:
            raise Http2Error(ErrorCode.PROTOCOL_ERROR, "ENABLE_PUSH must be 0 or 1")
        # HEADER_TABLE_SIZE: answers never index headers. Others do not concern a server.

    def _rst_stream(self, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise Http2Error(ErrorCode.FRAME_SIZE_ERROR, "RST_STREAM of the wrong size")
        if stream_id == 0 or stream_id > self._last_stream_id:
            raise Http2Error(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        stream = self._streams.pop(stream_id, None)
        if stream is not None:
            self.awaiting.pop(stream_id, None)
            self._out.forget(stream)
            code = _U32.unpack(payload)[0]
            self._events.append(StreamReset(stream_id, _error_code(code), True))
            self.peer_resets += 1
            self._charge_reset()
            self._close_if_done()

    # -- stream errors --------------------------------------------------------------------
    def _charge_reset(self) -> None:
        if self._resets.charge(self._last_read):
            raise Http2Error(ErrorCode.ENHANCE_YOUR_CALM, "too many stream resets")

    def _reset(self, stream_id: int, code: ErrorCode) -> None:
        """Reset a stream the peer got wrong; that counts against its reset budget too."""
        self._charge_reset()
        stream = self._streams.pop(stream_id, None)
        if stream is not None:
            self.awaiting.pop(stream_id, None)
            self._out.forget(stream)
            self._events.append(StreamReset(stream_id, code, False))
        self._out.write(rst_stream_frame(stream_id, code))
        self._close_if_done()


def _error_code(code: int) -> ErrorCode:
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.INTERNAL_ERROR  # unknown codes mean INTERNAL_ERROR (RFC 9113 7)
