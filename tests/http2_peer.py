"""A hand-driven HTTP/2 client for engine tests: raw frames in, the engine's events and frames out.

No sockets and no h2: frames are built and parsed here byte by byte, so the engine is checked
against RFC 9113's layout rather than against another implementation.
"""

from __future__ import annotations

from dataclasses import dataclass

import hpack

from ortserve.server.http2 import EngineConfig, Event, Http2Engine

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    range(10)
)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
HeadT = tuple[tuple[bytes, bytes], ...]
REQUEST = [(":method", "POST"), (":scheme", "http"), (":path", "/pkg.Service/Method"), ("te", "trailers")]


def raw_frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def u32(value: int) -> bytes:
    return value.to_bytes(4, "big")


def setting(code: int, value: int) -> bytes:
    return code.to_bytes(2, "big") + u32(value)


@dataclass(frozen=True)
class Frame:
    kind: int
    flags: int
    stream: int
    payload: bytes

    @property
    def error_code(self) -> int:
        """RST_STREAM's code, or GOAWAY's."""
        return int.from_bytes(self.payload[:4] if self.kind == RST_STREAM else self.payload[4:8], "big")


def parse_frames(data: bytes) -> list[Frame]:
    frames, pos = [], 0
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 3], "big")
        stream = int.from_bytes(data[pos + 5 : pos + 9], "big") & 0x7FFF_FFFF
        frames.append(Frame(data[pos + 3], data[pos + 4], stream, data[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    assert pos == len(data), "the engine wrote a cut frame"
    return frames


class Peer:
    """A client of one engine, with a clock the test moves."""

    def __init__(self, **config: float) -> None:
        self.now = 0.0
        self.engine: Http2Engine[HeadT] = Http2Engine(EngineConfig(**config), tuple, lambda: self.now)  # type: ignore[arg-type]
        self.encoder = hpack.Encoder()
        self.engine.initiate()
        self.sent: list[Frame] = []
        """Every frame the engine wrote, in order."""

    def handshake(self) -> Peer:
        assert self.send_raw(PREFACE + raw_frame(SETTINGS, 0, 0)) == []
        self.read()
        return self

    def send_raw(self, data: bytes) -> list[Event[HeadT]]:
        return self.engine.receive_data(data)

    def send(self, *frames: bytes) -> list[Event[HeadT]]:
        return self.send_raw(b"".join(frames))

    def read(self) -> list[Frame]:
        """Frames the engine wrote since the last read."""
        frames = parse_frames(b"".join(bytes(chunk) for chunk in self.engine.data_to_send()))
        self.sent += frames
        return frames

    def block(self, fields: list[tuple[str, str]] | None = None) -> bytes:
        return bytes(self.encoder.encode(REQUEST if fields is None else fields))

    def request(
        self, stream: int, end_stream: bool = False, fields: list[tuple[str, str]] | None = None
    ) -> bytes:
        flags = END_HEADERS | (END_STREAM if end_stream else 0)
        return raw_frame(HEADERS, flags, stream, self.block(fields))

    def goaway(self) -> Frame | None:
        found = [frame for frame in self.sent if frame.kind == GOAWAY]
        return found[-1] if found else None

    def resets(self) -> dict[int, int]:
        """Stream id to the code of the RST_STREAM the engine sent on it."""
        return {frame.stream: frame.error_code for frame in self.sent if frame.kind == RST_STREAM}
