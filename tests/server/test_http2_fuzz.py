"""Random frame sequences, interleaved with random application calls, against the HTTP/2 engine.

Properties: nothing but protocol outcomes come out (no exception, every byte written is whole
frames); memory stays within the configured bounds (buffered bytes, streams); after a
connection error or a reset no stream remains open, and a stream the application ends without
queued data is gone at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import hpack
from hypothesis import HealthCheck, given, settings
from hypothesis import event as count_event
from hypothesis import strategies as st

from http2_peer import (
    CONTINUATION,
    DATA,
    GOAWAY,
    HEADERS,
    PING,
    PREFACE,
    PRIORITY,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    Peer,
    parse_frames,
    raw_frame,
    setting,
    u32,
)
from ortserve.server.http2 import ConnectionEnded, DataReceived, RequestReceived, StreamReset

CONFIG = dict(
    max_concurrent_streams=4,
    max_header_list_bytes=2048,
    stream_window=4096,
    connection_window=16384,
    max_frame_size=16384,
    max_continuation_frames=8,
)
REQUEST = [(":method", "POST"), (":scheme", "http"), (":path", "/a/b"), ("te", "trailers")]
_never = [hpack.NeverIndexedHeaderTuple(name, value) for name, value in REQUEST]
BLOCKS = [
    bytes(hpack.Encoder().encode(_never)),  # leaves the table alone: cacheable
    bytes(hpack.Encoder().encode(REQUEST)),  # adds to the dynamic table
    bytes(hpack.Encoder().encode([("x-trailer", "1")])),  # trailers
    bytes(hpack.Encoder().encode([(":method", "POST"), (":path", "/a"), ("X-Upper", "1")])),  # malformed
    b"\xbe",  # the newest dynamic entry: valid only after an indexing block
    b"\xff\xff\xff\xff",  # not HPACK
    b"",
]
STREAMS = st.sampled_from([0, 1, 1, 3, 3, 5, 7, 9, 11, 2])
SIZES = st.sampled_from([0, 1, 100, 1000, 5000])


def _data(stream: int, flags: int, size: int, pad: int) -> bytes:
    body = bytes(size)
    if flags & 0x8:
        body = bytes((pad,)) + body + bytes(min(pad, 10))
    return raw_frame(DATA, flags, stream, body)


def _headers(stream: int, flags: int, block: int, cut: int) -> bytes:
    payload = BLOCKS[block]
    if flags & 0x20:
        payload = u32(stream) + b"\x10" + payload  # depends on itself: PROTOCOL_ERROR in h2's view
    if flags & 0x8:
        payload = b"\x02" + payload + b"\x00\x00"
    return raw_frame(HEADERS, flags, stream, payload[: len(payload) - cut])


ANY_FRAME = st.one_of(
    st.builds(_data, STREAMS, st.sampled_from([0, 1, 8, 9]), SIZES, st.integers(0, 255)),
    st.builds(
        _headers,
        STREAMS,
        st.sampled_from([4, 5, 4, 5, 0, 1, 0x24, 0x0C]),
        st.integers(0, len(BLOCKS) - 1),
        st.sampled_from([0, 0, 0, 2]),
    ),
    st.builds(
        lambda s, f, b: raw_frame(CONTINUATION, f, s, BLOCKS[b][:3]),
        STREAMS,
        st.sampled_from([0, 4]),
        st.integers(0, len(BLOCKS) - 1),
    ),
    st.builds(lambda s, n: raw_frame(PRIORITY, 0, s, bytes(n)), STREAMS, st.sampled_from([5, 5, 4])),
    st.builds(
        lambda s, c, n: raw_frame(RST_STREAM, 0, s, u32(c)[:n]),
        STREAMS,
        st.integers(0, 14),
        st.sampled_from([4, 4, 3]),
    ),
    st.builds(
        lambda f, pairs: raw_frame(SETTINGS, f, 0, b"".join(setting(k, v) for k, v in pairs)),
        st.sampled_from([0, 0, 1]),
        st.lists(
            st.tuples(
                st.integers(1, 7),
                st.sampled_from([0, 1, 100, 16_384, 65_535, 1 << 20, 2**31 - 1, 2**31, 1 << 24]),
            ),
            max_size=3,
        ),
    ),
    st.builds(
        lambda f, n: raw_frame(PING, f, 0, bytes(n)), st.sampled_from([0, 1]), st.sampled_from([8, 8, 7])
    ),
    st.builds(lambda s: raw_frame(GOAWAY, 0, s, bytes(8)), st.sampled_from([0, 0, 1])),
    st.builds(
        lambda s, i: raw_frame(WINDOW_UPDATE, 0, s, u32(i)),
        STREAMS,
        st.sampled_from([0, 1, 1000, 65_535, 2**31 - 1]),
    ),
    st.builds(lambda s: raw_frame(PUSH_PROMISE, 4, s, u32(2)), STREAMS),
    st.builds(lambda s: raw_frame(0x42, 0xFF, s, b"?"), STREAMS),
)
CLIENT_STREAMS = st.sampled_from([1, 3, 5, 7, 9, 11])
# Mostly what a client sends, so sequences get past their first frames; ANY_FRAME adds the rest.
FRAMES = st.one_of(
    st.builds(_headers, CLIENT_STREAMS, st.sampled_from([4, 5]), st.sampled_from([0, 1, 2]), st.just(0)),
    st.builds(_data, st.sampled_from([1, 3, 5]), st.sampled_from([0, 0, 1]), SIZES, st.just(0)),
    st.builds(
        lambda s, i: raw_frame(WINDOW_UPDATE, 0, s, u32(i)),
        st.sampled_from([0, 1, 3]),
        SIZES.map(lambda n: n + 1),
    ),
)
FRAMES = st.one_of(FRAMES, FRAMES, FRAMES, ANY_FRAME)
CALLS = st.tuples(
    st.sampled_from(["consume", "answer", "data", "end", "reset", "go_away", "tick"]),
    st.sampled_from([1, 3, 5, 7, 9, 11]),
    SIZES,
)
STEPS = st.lists(st.one_of(FRAMES.map(lambda f: ("frame", f)), CALLS.map(lambda c: ("call", c))), max_size=30)


def event_note(text: str) -> None:
    """Counted by hypothesis (``--hypothesis-show-statistics``): shows what the sequences reach."""
    count_event(text)


@dataclass
class Harness:
    """The application's side: what it was told is open, and what it queued."""

    peer: Peer = field(default_factory=lambda: Peer(**CONFIG))
    open: set[int] = field(default_factory=set)
    queued: set[int] = field(default_factory=set)
    """Streams the application sent body bytes on (they may wait for window)."""

    @property
    def bound(self) -> int:
        """What the engine may hold: a partial frame, an open header block, queued answers."""
        return CONFIG["max_frame_size"] + 9 + 2 * CONFIG["max_header_list_bytes"] + 30 * 5000

    def receive(self, data: bytes) -> None:
        for event in self.peer.send_raw(data):
            if isinstance(event, RequestReceived):
                assert event.stream_id not in self.open
                self.open.add(event.stream_id)
                event_note("a stream opened")
            elif isinstance(event, DataReceived):
                assert event.stream_id in self.open
                event_note("data delivered")
            elif isinstance(event, StreamReset):
                self.open.discard(event.stream_id)
                assert event.stream_id not in self.peer.engine.open_stream_ids
                event_note(f"stream reset {event.code.name}")
            elif isinstance(event, ConnectionEnded):
                assert self.peer.engine.closed and self.peer.engine.open_streams == 0
                event_note(f"connection error {event.code.name}: {event.message}")
                self.open.clear()

    def call(self, name: str, stream: int, size: int) -> None:
        engine = self.peer.engine
        if name == "consume":
            engine.consumed(stream)
        elif name == "answer":
            engine.send_response(stream, b"\x88", bytes(size), b"\x00\x01a\x010")
            self.queued.add(stream)
            self.open.discard(stream)
        elif name == "data":
            engine.send_headers(stream, b"\x88")
            engine.send_data(stream, bytes(size))
            self.queued.add(stream)
        elif name == "end":
            engine.send_headers(stream, b"\x00\x01a\x010", end_stream=True)
            self.open.discard(stream)
        elif name == "reset":
            engine.reset_stream(stream)
            self.open.discard(stream)
            assert stream not in engine.open_stream_ids
        elif name == "go_away":
            engine.go_away()
        else:
            self.peer.now += size / 100
            engine.tick()

    def check(self) -> None:
        engine = self.peer.engine
        parse_frames(b"".join(bytes(chunk) for chunk in engine.data_to_send()))
        assert engine.open_stream_ids <= self.open | self.queued
        assert engine.open_streams <= CONFIG["max_concurrent_streams"]
        assert engine.buffered_bytes <= self.bound
        # The running total the connection window's credit reads matches the streams' queues.
        waiting = sum(stream.outbound_bytes for stream in engine._streams.values())
        assert engine._out.waiting == waiting
        if engine.closed:
            assert engine.receive_data(raw_frame(PING, 0, 0, bytes(8))) == []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS, split=st.integers(0, 40), opened=st.integers(0, 3))
def test_random_frames_and_calls_keep_the_engine_within_its_bounds(
    steps: list[tuple[str, object]], split: int, opened: int
) -> None:
    harness = Harness()
    harness.receive(PREFACE[:split] if split < len(PREFACE) else PREFACE)
    harness.receive(PREFACE[split:] if split < len(PREFACE) else b"")
    harness.receive(b"".join(_headers(stream, 4, 0, 0) for stream in (1, 3, 5)[:opened]))
    for kind, step in steps:
        if kind == "frame":
            assert isinstance(step, bytes)
            cut = split % (len(step) + 1)
            harness.receive(step[:cut])  # frames arrive in pieces too
            harness.receive(step[cut:])
        else:
            harness.call(*step)  # type: ignore[misc]
        harness.check()
    for stream in list(harness.open):  # the application ends every call it was told about
        harness.call("end", stream, 0)
    harness.check()
    assert harness.peer.engine.open_stream_ids <= harness.queued
