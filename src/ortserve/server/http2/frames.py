"""HTTP/2 framing (RFC 9113 section 4-6): frame types, flags, error codes, settings, and building frames."""

from __future__ import annotations

import struct
from enum import IntEnum

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_WINDOW",
    "FRAME_HEADER",
    "MAX_WINDOW",
    "PREFACE",
    "ErrorCode",
    "Flag",
    "FrameType",
    "Http2Error",
    "Setting",
    "data_frame",
    "frame",
    "goaway_frame",
    "header_frames",
    "rst_stream_frame",
    "settings_frame",
    "unpad",
    "window_update_frame",
]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DEFAULT_MAX_FRAME_SIZE = 16_384
DEFAULT_WINDOW = 65_535
MAX_WINDOW = 2**31 - 1

# Length is 24 bits: read as a 16-bit high part and an 8-bit low part.
FRAME_HEADER = struct.Struct(">HBBBL")
_STREAM_MASK = 0x7FFF_FFFF


class FrameType(IntEnum):
    DATA = 0x0
    HEADERS = 0x1
    PRIORITY = 0x2
    RST_STREAM = 0x3
    SETTINGS = 0x4
    PUSH_PROMISE = 0x5
    PING = 0x6
    GOAWAY = 0x7
    WINDOW_UPDATE = 0x8
    CONTINUATION = 0x9


class Flag:
    """Frame flags; which apply depends on the frame type."""

    END_STREAM = 0x1
    ACK = 0x1
    END_HEADERS = 0x4
    PADDED = 0x8
    PRIORITY = 0x20


class ErrorCode(IntEnum):
    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


class Setting(IntEnum):
    HEADER_TABLE_SIZE = 0x1
    ENABLE_PUSH = 0x2
    MAX_CONCURRENT_STREAMS = 0x3
    INITIAL_WINDOW_SIZE = 0x4
    MAX_FRAME_SIZE = 0x5
    MAX_HEADER_LIST_SIZE = 0x6


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame: the 9-byte header, then the payload."""
    length = len(payload)
    return FRAME_HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream_id & _STREAM_MASK) + payload


def data_frame(stream_id: int, payload: bytes | memoryview, end_stream: bool) -> list[bytes | memoryview]:
    """A DATA frame as header and payload, so a large payload is written without being copied."""
    length = len(payload)
    flags = Flag.END_STREAM if end_stream else 0
    header = FRAME_HEADER.pack(length >> 8, length & 0xFF, FrameType.DATA, flags, stream_id)
    return [header, payload]


def settings_frame(settings: dict[Setting, int]) -> bytes:
    payload = b"".join(struct.pack(">HL", key, value) for key, value in settings.items())
    return frame(FrameType.SETTINGS, 0, 0, payload)


def window_update_frame(stream_id: int, increment: int) -> bytes:
    return frame(FrameType.WINDOW_UPDATE, 0, stream_id, struct.pack(">L", increment))


def rst_stream_frame(stream_id: int, code: ErrorCode) -> bytes:
    return frame(FrameType.RST_STREAM, 0, stream_id, struct.pack(">L", code))


def goaway_frame(last_stream_id: int, code: ErrorCode, debug: str = "") -> bytes:
    """GOAWAY with ``debug`` as plain ASCII text (anything else replaced), cut to 256 bytes."""
    text = debug.encode("ascii", "replace")[:256]
    return frame(FrameType.GOAWAY, 0, 0, struct.pack(">LL", last_stream_id, code) + text)


class Http2Error(Exception):
    """A connection error (RFC 9113 5.4.1): the connection ends with GOAWAY and this code."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def header_frames(stream_id: int, block: bytes, end_stream: bool, max_frame: int) -> bytes:
    """A header block as HEADERS, then CONTINUATION frames when it is larger than the peer's frames."""
    flags = Flag.END_STREAM if end_stream else 0
    if len(block) <= max_frame:
        return frame(FrameType.HEADERS, flags | Flag.END_HEADERS, stream_id, block)
    parts = [block[i : i + max_frame] for i in range(0, len(block), max_frame)]
    frames = [frame(FrameType.HEADERS, flags, stream_id, parts[0])]
    frames += [frame(FrameType.CONTINUATION, 0, stream_id, part) for part in parts[1:-1]]
    frames.append(frame(FrameType.CONTINUATION, Flag.END_HEADERS, stream_id, parts[-1]))
    return b"".join(frames)


def unpad(payload: memoryview) -> memoryview:
    """A PADDED frame's payload without its pad length byte and padding.

    Raises:
        Http2Error: the padding is longer than the frame.
    """
    if not payload:
        raise Http2Error(ErrorCode.PROTOCOL_ERROR, "padded frame without a pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise Http2Error(ErrorCode.PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - pad]
