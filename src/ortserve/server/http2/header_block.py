"""Assembling a request's header block from its frames: a HEADERS frame's fragment (padding and
priority stripped), then CONTINUATION frames until END_HEADERS, within bounded size and count.

Decoding the assembled block is :mod:`~ortserve.server.http2.headers`' work; what the block means
for the stream is the engine's. Nothing here calls back into the engine: the engine's frame loop
calls :meth:`OpenHeaderBlock.add` in place of a method of its own, so a CONTINUATION frame costs
no extra call.
"""

from __future__ import annotations

import struct

from ortserve.server.http2.config import EngineConfig
from ortserve.server.http2.frames import ErrorCode, Flag, FrameType, Http2Error, unpad

__all__ = ["SELF_DEPENDENT", "OpenHeaderBlock", "head_fragment"]

SELF_DEPENDENT = 0x100
"""Not a wire flag: marks a HEADERS frame whose priority names its own stream."""
_U32 = struct.Struct(">L")


def head_fragment(flags: int, stream_id: int, payload: memoryview) -> tuple[int, memoryview]:
    """A HEADERS frame's header block fragment, without padding or priority, and its flags
    (with :data:`SELF_DEPENDENT` added when the priority names the stream itself).

    Raises:
        Http2Error: a HEADERS frame on stream 0 or an even stream, bad padding, or a frame too
            short for its priority.
    """
    if stream_id == 0 or stream_id % 2 == 0:
        raise Http2Error(ErrorCode.PROTOCOL_ERROR, f"HEADERS on stream {stream_id}")
    if flags & Flag.PADDED:
        payload = unpad(payload)
    if flags & Flag.PRIORITY:
        if len(payload) < 5:
            raise Http2Error(ErrorCode.FRAME_SIZE_ERROR, "HEADERS too short for its priority")
        if _U32.unpack_from(payload)[0] & 0x7FFF_FFFF == stream_id:
            flags |= SELF_DEPENDENT
        payload = payload[5:]
    return flags, payload


class OpenHeaderBlock:
    """A header block begun by a HEADERS frame without END_HEADERS, waiting for CONTINUATION.

    Args:
        stream_id: the stream of the HEADERS frame.
        flags: that frame's flags, as :func:`head_fragment` returned them.
        fragment: that frame's fragment (copied: the read buffer is not kept).
        config: the limits on CONTINUATION frames and on the block's size.
    """

    __slots__ = ("_config", "continuations", "flags", "parts", "size", "stream_id")

    def __init__(self, stream_id: int, flags: int, fragment: bytes, config: EngineConfig) -> None:
        self.stream_id = stream_id
        self.flags = flags
        self.parts = [fragment]
        self.size = len(fragment)
        self.continuations = 0
        self._config = config

    def add(self, kind: int, flags: int, stream_id: int, payload: memoryview) -> bytes | None:
        """Take the next frame; returns the whole block once END_HEADERS ends it.

        Raises:
            Http2Error: the frame is not a CONTINUATION of this stream, or the block passed
                ``max_continuation_frames`` frames or twice ``max_header_list_bytes``.
        """
        if kind != FrameType.CONTINUATION or stream_id != self.stream_id:
            raise Http2Error(ErrorCode.PROTOCOL_ERROR, "a header block was interrupted")
        self.continuations += 1
        if self.continuations > self._config.max_continuation_frames:
            raise Http2Error(ErrorCode.ENHANCE_YOUR_CALM, "too many CONTINUATION frames")
        self.size += len(payload)
        if self.size > 2 * self._config.max_header_list_bytes:
            raise Http2Error(ErrorCode.ENHANCE_YOUR_CALM, "header block too large")
        self.parts.append(bytes(payload))
        if flags & Flag.END_HEADERS:
            return b"".join(self.parts)
        return None
