"""The sans-IO HTTP/2 engine, frame type by frame type, on raw bytes and a hand-moved clock."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from http2_peer import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    Peer,
    raw_frame,
    setting,
    u32,
)
from ortserve.server.http2 import ConnectionEnded, DataReceived, ErrorCode, RequestReceived, StreamReset

STREAM_WINDOW = 4 << 20


def ended(events: Sequence[object]) -> ErrorCode | None:
    """The code of the ConnectionEnded among ``events``, if any."""
    codes = [event.code for event in events if isinstance(event, ConnectionEnded)]
    return codes[0] if codes else None


def connection_error(peer: Peer, *frames: bytes) -> ErrorCode | None:
    code = ended(peer.send(*frames))
    frame = peer.read()[-1] if code is not None else None
    if code is not None:
        assert frame is not None and frame.kind == GOAWAY and frame.error_code == code
        assert peer.engine.closed and peer.engine.open_streams == 0
    return code


# -- the preface and SETTINGS ----------------------------------------------------------------
def test_the_engine_opens_with_its_settings_and_a_larger_connection_window() -> None:
    peer = Peer()
    settings, update = peer.read()
    assert settings.kind == SETTINGS and setting(4, STREAM_WINDOW) in settings.payload
    assert update.kind == WINDOW_UPDATE and update.stream == 0


def test_a_preface_in_pieces_is_accepted_and_the_peers_settings_acknowledged() -> None:
    peer = Peer()
    peer.read()
    assert peer.send_raw(PREFACE[:5]) == []
    assert peer.send_raw(PREFACE[5:] + raw_frame(SETTINGS, 0, 0, setting(4, 1000))) == []
    [ack] = peer.read()
    assert (ack.kind, ack.flags, ack.payload) == (SETTINGS, ACK, b"")


def test_anything_but_the_preface_is_a_connection_error() -> None:
    peer = Peer()
    assert ended(peer.send_raw(b"GET / HTTP/1.1\r\n\r\n")) == ErrorCode.PROTOCOL_ERROR
    assert peer.read()[-1].payload[8:] == b"not an HTTP/2 connection preface"


def test_no_preface_before_the_deadline_closes_the_connection() -> None:
    peer = Peer(preface_timeout_s=10.0)
    assert peer.engine.tick() == 10.0
    peer.now = 10.0
    assert peer.engine.tick() is None
    assert peer.engine.closed and peer.read()[-1].kind == GOAWAY


@pytest.mark.parametrize(
    ("payload", "flags", "stream", "code"),
    [
        (b"\x00" * 5, 0, 0, ErrorCode.FRAME_SIZE_ERROR),
        (b"x", ACK, 0, ErrorCode.FRAME_SIZE_ERROR),
        (b"", 0, 1, ErrorCode.PROTOCOL_ERROR),
        (setting(4, 2**31), 0, 0, ErrorCode.FLOW_CONTROL_ERROR),
        (setting(5, 100), 0, 0, ErrorCode.PROTOCOL_ERROR),
        (setting(5, 1 << 24), 0, 0, ErrorCode.PROTOCOL_ERROR),
        (setting(2, 2), 0, 0, ErrorCode.PROTOCOL_ERROR),
    ],
)
def test_bad_settings_are_connection_errors(payload: bytes, flags: int, stream: int, code: ErrorCode) -> None:
    peer = Peer().handshake()
    assert connection_error(peer, raw_frame(SETTINGS, flags, stream, payload)) == code


def test_unknown_settings_and_frame_types_are_ignored() -> None:
    peer = Peer().handshake()
    assert peer.send(raw_frame(SETTINGS, 0, 0, setting(0x99, 7)), raw_frame(0x42, 0xFF, 3, b"??")) == []
    assert [frame.kind for frame in peer.read()] == [SETTINGS]


# -- HEADERS and CONTINUATION ------------------------------------------------------------------
def test_a_request_opens_a_stream_with_the_interpreted_head() -> None:
    peer = Peer().handshake()
    [event] = peer.send(peer.request(1))
    assert isinstance(event, RequestReceived) and event.stream_id == 1 and not event.end_stream
    assert (b":path", b"/pkg.Service/Method") in event.head
    assert peer.engine.open_streams == 1


def test_a_header_block_in_continuation_frames_is_joined_and_padding_and_priority_skipped() -> None:
    peer = Peer().handshake()
    block = peer.block()
    head = b"\x03" + b"\x00\x00\x00\x00\x10" + block[:4] + b"pad"  # pad length 3, priority
    events = peer.send(
        raw_frame(HEADERS, PADDED | PRIORITY_FLAG, 1, head),
        raw_frame(CONTINUATION, 0, 1, block[4:8]),
        raw_frame(CONTINUATION, END_HEADERS, 1, block[8:]),
    )
    assert [type(event) for event in events] == [RequestReceived]


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        ([raw_frame(HEADERS, END_HEADERS, 2, b"\x82")], ErrorCode.PROTOCOL_ERROR),
        ([raw_frame(HEADERS, END_HEADERS, 0, b"\x82")], ErrorCode.PROTOCOL_ERROR),
        ([raw_frame(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff")], ErrorCode.COMPRESSION_ERROR),
        ([raw_frame(HEADERS, 0, 1, b"\x82"), raw_frame(PING, 0, 0, bytes(8))], ErrorCode.PROTOCOL_ERROR),
        ([raw_frame(HEADERS, 0, 1, b"\x82"), raw_frame(CONTINUATION, 0, 3)], ErrorCode.PROTOCOL_ERROR),
        ([raw_frame(CONTINUATION, END_HEADERS, 1, b"\x82")], ErrorCode.PROTOCOL_ERROR),
        ([raw_frame(HEADERS, PADDED | END_HEADERS, 1, b"\x05ab")], ErrorCode.PROTOCOL_ERROR),
        ([raw_frame(HEADERS, PRIORITY_FLAG | END_HEADERS, 1, b"\x00")], ErrorCode.FRAME_SIZE_ERROR),
        ([raw_frame(PUSH_PROMISE, END_HEADERS, 1, u32(2))], ErrorCode.PROTOCOL_ERROR),
    ],
)
def test_header_frames_that_break_the_rules_are_connection_errors(
    frames: list[bytes], code: ErrorCode
) -> None:
    assert connection_error(Peer().handshake(), *frames) == code


def test_a_continuation_flood_ends_after_the_frame_cap_with_work_per_frame() -> None:
    peer = Peer(max_continuation_frames=64).handshake()
    flood = raw_frame(HEADERS, 0, 1, b"\x82") + raw_frame(CONTINUATION, 0, 1) * 16_000
    assert connection_error(peer, flood) == ErrorCode.ENHANCE_YOUR_CALM
    assert peer.goaway() is not None and peer.goaway().payload[8:] == b"too many CONTINUATION frames"  # type: ignore[union-attr]


def test_a_header_block_larger_than_twice_the_header_list_limit_is_refused_as_it_grows() -> None:
    peer = Peer(max_header_list_bytes=1000).handshake()
    frames = [raw_frame(HEADERS, 0, 1, b"\x82")] + [raw_frame(CONTINUATION, 0, 1, bytes(500))] * 5
    assert connection_error(peer, *frames) == ErrorCode.ENHANCE_YOUR_CALM


def test_a_header_block_of_one_frame_is_bounded_like_an_assembled_one() -> None:
    """A single HEADERS frame may be a megabyte; the block's bound (twice the header list
    limit) holds for it as for a block assembled from CONTINUATION frames."""
    peer = Peer(max_header_list_bytes=1000).handshake()
    padded = b"\x20" * 2 + b"\x82" * 1999  # within 2,001 bytes of HPACK
    assert connection_error(peer, raw_frame(HEADERS, END_HEADERS, 1, padded)) == ErrorCode.ENHANCE_YOUR_CALM
    assert peer.goaway().payload[8:] == b"header block too large"  # type: ignore[union-attr]


@pytest.mark.parametrize(("updates", "ends"), [(2, False), (3, True), (20_000, True)])
def test_at_most_two_table_size_updates_may_open_a_block(updates: int, ends: bool) -> None:
    """RFC 7541 4.2: two size updates (the smallest, then the final size); more is a
    COMPRESSION_ERROR, not work for the decoder that adds no field to the header list."""
    peer = Peer().handshake()
    block = b"\x3f\xe1\x1f" * updates + peer.block()  # each: size 4,096 (5-bit prefix, 2 more bytes)
    code = connection_error(peer, raw_frame(HEADERS, END_HEADERS, 1, block))
    assert code == (ErrorCode.COMPRESSION_ERROR if ends else None)


@pytest.mark.parametrize(
    "fields",
    [
        [(":method", "POST"), (":scheme", "http")],
        [(":method", "POST"), (":scheme", "http"), (":path", "/a"), (":status", "200")],
        [(":method", "POST"), ("x", "1"), (":scheme", "http"), (":path", "/a")],
        [(":method", "POST"), (":scheme", "http"), (":path", "/a"), ("connection", "close")],
        [(":method", "POST"), (":scheme", "http"), (":path", "/a"), ("te", "gzip")],
        [(":method", "POST"), (":scheme", "http"), (":path", "/a"), ("X-Upper", "1")],
    ],
)
def test_a_malformed_request_resets_its_stream_without_telling_the_application(
    fields: list[tuple[str, str]],
) -> None:
    peer = Peer().handshake()
    assert peer.send(peer.request(1, fields=fields)) == []
    peer.read()
    assert peer.resets() == {1: ErrorCode.PROTOCOL_ERROR}
    assert [type(e) for e in peer.send(peer.request(3))] == [RequestReceived]  # the connection serves on


def test_streams_over_the_concurrency_limit_are_refused_and_counted_against_resets() -> None:
    peer = Peer(max_concurrent_streams=2).handshake()
    events = peer.send(peer.request(1), peer.request(3), peer.request(5))
    assert [e.stream_id for e in events if isinstance(e, RequestReceived)] == [1, 3]
    peer.read()
    assert peer.resets() == {5: ErrorCode.REFUSED_STREAM}


def test_request_trailers_end_the_request_and_trailers_that_do_not_reset_it() -> None:
    peer = Peer().handshake()
    peer.send(peer.request(1), peer.request(3))
    [event] = peer.send(raw_frame(HEADERS, END_HEADERS | END_STREAM, 1, peer.block([("x-sum", "1")])))
    assert isinstance(event, DataReceived) and event.end_stream and not event.data
    [reset] = peer.send(raw_frame(HEADERS, END_HEADERS, 3, peer.block([("x-sum", "1")])))
    assert isinstance(reset, StreamReset) and reset.code == ErrorCode.PROTOCOL_ERROR and not reset.remote


def test_trailers_with_a_pseudo_header_reset_the_stream_and_a_block_after_the_end_is_stream_closed() -> None:
    peer = Peer().handshake()
    peer.send(peer.request(1), peer.request(3, end_stream=True))
    [malformed] = peer.send(raw_frame(HEADERS, END_HEADERS | END_STREAM, 1, peer.block([(":path", "/x")])))
    assert isinstance(malformed, StreamReset) and malformed.code == ErrorCode.PROTOCOL_ERROR
    [late] = peer.send(raw_frame(HEADERS, END_HEADERS | END_STREAM, 3, peer.block([("x-sum", "1")])))
    assert isinstance(late, StreamReset) and late.code == ErrorCode.STREAM_CLOSED  # half-closed (remote)


def test_headers_on_a_closed_stream_are_answered_stream_closed() -> None:
    peer = Peer().handshake()
    peer.send(peer.request(3, end_stream=True))
    peer.engine.send_headers(3, b"\x88", end_stream=True)
    assert peer.send(peer.request(1)) == []  # a lower id: closed
    peer.read()
    assert peer.resets()[1] == ErrorCode.STREAM_CLOSED


# -- DATA and receive flow control ---------------------------------------------------------------
def test_data_is_delivered_without_padding_and_ends_the_stream() -> None:
    peer = Peer().handshake()
    peer.send(peer.request(1))
    [data, end] = peer.send(raw_frame(DATA, PADDED, 1, b"\x02abcXY"), raw_frame(DATA, END_STREAM, 1, b"d"))
    assert isinstance(data, DataReceived) and bytes(data.data) == b"abc" and not data.end_stream
    assert isinstance(end, DataReceived) and bytes(end.data) == b"d" and end.end_stream


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (raw_frame(DATA, 0, 0, b"x"), ErrorCode.PROTOCOL_ERROR),
        (raw_frame(DATA, 0, 7, b"x"), ErrorCode.PROTOCOL_ERROR),
        (raw_frame(DATA, PADDED, 1, b""), ErrorCode.PROTOCOL_ERROR),
        (raw_frame(DATA, 0, 1, bytes(2 << 20)), ErrorCode.FRAME_SIZE_ERROR),
    ],
)
def test_data_that_breaks_the_rules_is_a_connection_error(frame: bytes, code: ErrorCode) -> None:
    peer = Peer(max_frame_size=1 << 20).handshake()
    peer.send(peer.request(1))
    assert connection_error(peer, frame) == code


def test_data_beyond_the_connection_window_is_a_connection_error() -> None:
    peer = Peer(connection_window=100_000, stream_window=200_000).handshake()
    peer.send(peer.request(1))
    assert connection_error(peer, raw_frame(DATA, 0, 1, bytes(100_001))) == ErrorCode.FLOW_CONTROL_ERROR


def test_data_beyond_a_stream_window_resets_only_that_stream() -> None:
    peer = Peer(stream_window=1000).handshake()
    peer.send(peer.request(1), peer.request(3))
    [reset] = peer.send(raw_frame(DATA, 0, 1, bytes(1001)))
    assert isinstance(reset, StreamReset) and reset.code == ErrorCode.FLOW_CONTROL_ERROR
    assert [type(e) for e in peer.send(raw_frame(DATA, 0, 3, bytes(1000)))] == [DataReceived]


def test_data_after_the_end_of_the_stream_resets_it_and_data_on_a_finished_stream_is_dropped() -> None:
    peer = Peer().handshake()
    peer.send(peer.request(1, end_stream=True), peer.request(3))
    [reset] = peer.send(raw_frame(DATA, 0, 1, b"late"))
    assert isinstance(reset, StreamReset) and reset.code == ErrorCode.STREAM_CLOSED
    assert peer.send(raw_frame(DATA, 0, 1, b"in flight")) == []  # closed now: dropped


def test_the_connection_window_is_credited_as_data_arrives() -> None:
    peer = Peer(connection_window=1000, stream_window=1000).handshake()
    peer.send(peer.request(1), peer.request(3))
    peer.send(raw_frame(DATA, 0, 1, bytes(499)))
    assert [f for f in peer.read() if f.kind == WINDOW_UPDATE] == []
    peer.send(raw_frame(DATA, 0, 3, bytes(1)))
    [update] = peer.read()
    assert (update.kind, update.stream, update.payload) == (WINDOW_UPDATE, 0, u32(500))


def test_a_stream_window_reopens_only_after_the_application_consumed_its_data() -> None:
    peer = Peer(stream_window=1000).handshake()
    peer.send(peer.request(1))
    peer.send(raw_frame(DATA, 0, 1, bytes(600)))
    assert peer.read() == []
    peer.engine.consumed(1)
    [update] = peer.read()
    assert (update.kind, update.stream, update.payload) == (WINDOW_UPDATE, 1, u32(600))


def test_a_stream_whose_answers_pile_up_gets_no_more_window() -> None:
    peer = Peer(stream_window=1000).handshake()
    peer.send(raw_frame(SETTINGS, 0, 0, setting(4, 0)), peer.request(1))
    peer.engine.send_headers(1, b"\x88")
    peer.engine.send_data(1, bytes(2000))  # the client's window is 0: all of it waits
    peer.send(raw_frame(DATA, 0, 1, bytes(600)))
    peer.engine.consumed(1)
    assert [f for f in peer.read() if f.kind == WINDOW_UPDATE and f.stream == 1] == []


def test_no_connection_window_is_given_back_while_answers_pile_up_waiting_for_the_peers() -> None:
    """A peer that reads but grants no window: once answers waiting for it pass the connection
    window (16 MiB), the DATA it sends is not credited back, so it cannot go on sending
    requests whose answers pile up; the credit comes as soon as the answers leave."""
    peer = Peer().handshake()
    peer.send(raw_frame(SETTINGS, 0, 0, setting(4, 0)), peer.request(1, end_stream=True))
    peer.engine.send_headers(1, b"\x88")
    peer.engine.send_data(1, bytes(17 << 20))
    peer.read()
    chunk = bytes(1 << 20)
    for stream in (3, 5, 7):
        peer.send(peer.request(stream), *(raw_frame(DATA, 0, stream, chunk) for _ in range(3)))
    assert [f for f in peer.read() if f.kind == WINDOW_UPDATE and f.stream == 0] == []
    peer.send(raw_frame(WINDOW_UPDATE, 0, 0, u32(32 << 20)), raw_frame(WINDOW_UPDATE, 0, 1, u32(32 << 20)))
    frames = peer.read()
    assert sum(len(f.payload) for f in frames if f.kind == DATA and f.stream == 1) == 17 << 20
    [credit] = [f for f in frames if f.kind == WINDOW_UPDATE and f.stream == 0]
    assert int.from_bytes(credit.payload, "big") == 9 << 20


# -- the send side -------------------------------------------------------------------------------
def test_a_small_answer_leaves_as_headers_data_and_trailers_and_ends_the_stream() -> None:
    peer = Peer().handshake()
    peer.send(peer.request(1, end_stream=True))
    peer.engine.send_response(1, b"\x88", b"payload", b"\x00\x01a\x010")
    frames = peer.read()
    assert [(f.kind, f.flags) for f in frames] == [
        (HEADERS, END_HEADERS),
        (DATA, 0),
        (HEADERS, END_HEADERS | END_STREAM),
    ]
    assert frames[1].payload == b"payload" and peer.engine.open_streams == 0


def test_an_answer_to_a_client_still_sending_tells_it_to_stop() -> None:
    peer = Peer().handshake()
    peer.send(peer.request(1))
    peer.engine.send_headers(1, b"\x88", end_stream=True)
    assert peer.read()[-1].kind == RST_STREAM and peer.resets() == {1: ErrorCode.NO_ERROR}
    assert peer.engine.open_streams == 0


def test_an_answer_larger_than_the_windows_waits_for_window_updates_and_trailers_come_last() -> None:
    peer = Peer().handshake()
    peer.send(raw_frame(SETTINGS, 0, 0, setting(4, 100)), peer.request(1, end_stream=True))
    peer.read()
    peer.engine.send_response(1, b"\x88", bytes(250), b"\x00\x01a\x010")
    assert [(f.kind, len(f.payload)) for f in peer.read()] == [(HEADERS, 1), (DATA, 100)]
    peer.send(raw_frame(WINDOW_UPDATE, 0, 1, u32(100)))
    assert [(f.kind, len(f.payload)) for f in peer.read()] == [(DATA, 100)]
    peer.send(raw_frame(WINDOW_UPDATE, 0, 1, u32(1000)))
    assert [(f.kind, f.flags) for f in peer.read()] == [(DATA, 0), (HEADERS, END_HEADERS | END_STREAM)]


def counted_flushes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one for every stream the send side is asked to flush."""
    from ortserve.server.http2.outbound import Outbound

    flushes: list[int] = []
    original = Outbound.flush

    def counted(self: Outbound, stream: object) -> None:
        flushes.append(1)
        original(self, stream)  # type: ignore[arg-type]

    monkeypatch.setattr(Outbound, "flush", counted)
    return flushes


def test_a_one_byte_connection_window_update_moves_one_waiting_stream_not_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fifty answers wait for the connection window; a flood of one-byte WINDOW_UPDATEs on
    stream 0 must cost work per frame, not a walk over every waiting stream per frame."""
    peer = Peer().handshake()
    peer.send(*(peer.request(2 * i + 1, True) for i in range(50)))
    for i in range(50):
        peer.engine.send_response(2 * i + 1, b"\x88", bytes(2000), b"\x00\x01a\x010")  # 100 KB > 65,535
    peer.read()
    flushes = counted_flushes(monkeypatch)
    peer.send(*(raw_frame(WINDOW_UPDATE, 0, 0, u32(1)) for _ in range(100)))
    assert len(flushes) <= 100 * 2
    assert sum(len(f.payload) for f in peer.read() if f.kind == DATA) == 100


def test_connection_window_updates_never_walk_streams_waiting_for_their_own_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """INITIAL_WINDOW_SIZE 0: every answer waits for its stream's window. A flood of one-byte
    connection WINDOW_UPDATEs walked all of them per frame (40 us a frame with 1,000 streams);
    they move when their own windows open."""
    peer = Peer().handshake()
    peer.send(raw_frame(SETTINGS, 0, 0, setting(4, 0)), *(peer.request(2 * i + 1, True) for i in range(50)))
    for i in range(50):
        peer.engine.send_response(2 * i + 1, b"\x88", b"answer", b"\x00\x01a\x010")
    peer.read()
    flushes = counted_flushes(monkeypatch)
    peer.send(*(raw_frame(WINDOW_UPDATE, 0, 0, u32(1)) for _ in range(200)))
    assert flushes == [] and [f for f in peer.read() if f.kind == DATA] == []
    peer.send(raw_frame(SETTINGS, 0, 0, setting(4, 100)))
    assert sum(1 for f in peer.read() if f.kind == DATA and f.payload == b"answer") == 50


def test_data_frames_never_exceed_the_peers_max_frame_size() -> None:
    peer = Peer().handshake()
    peer.send(raw_frame(WINDOW_UPDATE, 0, 0, u32(1 << 20)), raw_frame(SETTINGS, 0, 0, setting(4, 1 << 20)))
    peer.send(peer.request(1, end_stream=True))
    peer.read()
    peer.engine.send_headers(1, b"\x88")
    peer.engine.send_data(1, bytes(40_000))
    sizes = [len(f.payload) for f in peer.read() if f.kind == DATA]
    assert sizes == [16_384, 16_384, 7232]


def test_a_reset_stream_sends_nothing_more() -> None:
    peer = Peer().handshake()
    peer.send(raw_frame(SETTINGS, 0, 0, setting(4, 0)), peer.request(1))
    peer.engine.send_headers(1, b"\x88")
    peer.engine.send_data(1, bytes(100))
    [reset] = peer.send(raw_frame(RST_STREAM, 0, 1, u32(ErrorCode.CANCEL)))
    assert isinstance(reset, StreamReset) and reset.remote and reset.code == ErrorCode.CANCEL
    peer.read()
    peer.send(raw_frame(WINDOW_UPDATE, 0, 0, u32(1000)))
    peer.engine.send_data(1, b"more")
    assert peer.read() == [] and peer.engine.buffered_bytes == 0


# -- WINDOW_UPDATE ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (raw_frame(WINDOW_UPDATE, 0, 0, u32(0)), ErrorCode.PROTOCOL_ERROR),
        (raw_frame(WINDOW_UPDATE, 0, 0, b"\x00\x01"), ErrorCode.FRAME_SIZE_ERROR),
        (raw_frame(WINDOW_UPDATE, 0, 0, u32(2**31 - 1)), ErrorCode.FLOW_CONTROL_ERROR),
        (raw_frame(WINDOW_UPDATE, 0, 9, u32(1)), ErrorCode.PROTOCOL_ERROR),
    ],
)
def test_bad_window_updates_are_connection_errors(frame: bytes, code: ErrorCode) -> None:
    assert connection_error(Peer().handshake(), frame) == code


@pytest.mark.parametrize("increment", [0, 2**31 - 1])
def test_a_zero_or_overflowing_stream_window_update_resets_that_stream(increment: int) -> None:
    peer = Peer().handshake()
    peer.send(peer.request(1))
    [reset] = peer.send(raw_frame(WINDOW_UPDATE, 0, 1, u32(increment)))
    assert isinstance(reset, StreamReset) and not reset.remote
    code = ErrorCode.PROTOCOL_ERROR if increment == 0 else ErrorCode.FLOW_CONTROL_ERROR
    assert reset.code == code and peer.engine.open_streams == 0


def test_a_settings_change_that_overflows_a_stream_window_is_a_connection_error() -> None:
    peer = Peer().handshake()
    peer.send(peer.request(1), raw_frame(WINDOW_UPDATE, 0, 1, u32(2**31 - 1 - 65_535)))
    code = connection_error(peer, raw_frame(SETTINGS, 0, 0, setting(4, 65_536)))
    assert code == ErrorCode.FLOW_CONTROL_ERROR


def test_one_settings_frame_walks_the_streams_once_with_its_last_initial_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A frame may repeat INITIAL_WINDOW_SIZE 170,000 times (a megabyte): every entry is
    checked, the streams are walked once, with the last value, and a waiting answer moves."""
    from ortserve.server.http2.outbound import Outbound

    walks: list[int] = []
    original = Outbound.set_initial_window

    def counted(self: Outbound, value: int, streams: object) -> bool:
        walks.append(value)
        return original(self, value, streams)  # type: ignore[arg-type]

    monkeypatch.setattr(Outbound, "set_initial_window", counted)
    peer = Peer().handshake()
    peer.send(raw_frame(SETTINGS, 0, 0, setting(4, 0)), *(peer.request(2 * i + 1, True) for i in range(50)))
    peer.engine.send_response(1, b"\x88", bytes(300), b"\x00\x01a\x010")
    peer.read()
    entries = b"".join(setting(4, value) for value in [7, 0, 65_535] * 20_000 + [200])
    peer.send(raw_frame(SETTINGS, 0, 0, entries))
    assert walks == [0, 200]
    data = [len(f.payload) for f in peer.read() if f.kind == DATA and f.stream == 1]
    assert data == [200]
    bad_then_good = setting(4, 2**31) + setting(4, 100)
    assert connection_error(peer, raw_frame(SETTINGS, 0, 0, bad_then_good)) == ErrorCode.FLOW_CONTROL_ERROR


def test_a_settings_flood_ends_the_connection_and_a_few_a_second_never_do() -> None:
    peer = Peer().handshake()
    for _ in range(200):  # 20 a second, for ten seconds: well within the budget
        assert peer.send(raw_frame(SETTINGS, 0, 0, setting(4, 65_535))) == []
        peer.now += 0.05
    flood = raw_frame(SETTINGS, 0, 0) * 200
    assert connection_error(peer, flood) == ErrorCode.ENHANCE_YOUR_CALM
    assert peer.goaway().payload[8:] == b"too many SETTINGS frames"  # type: ignore[union-attr]


# -- RST_STREAM, PRIORITY, PING, GOAWAY ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (raw_frame(RST_STREAM, 0, 0, u32(0)), ErrorCode.PROTOCOL_ERROR),
        (raw_frame(RST_STREAM, 0, 5, u32(0)), ErrorCode.PROTOCOL_ERROR),
        (raw_frame(RST_STREAM, 0, 1, b"\x00"), ErrorCode.FRAME_SIZE_ERROR),
        (raw_frame(PRIORITY, 0, 0, bytes(5)), ErrorCode.PROTOCOL_ERROR),
        (raw_frame(PING, 0, 1, bytes(8)), ErrorCode.PROTOCOL_ERROR),
        (raw_frame(PING, 0, 0, bytes(7)), ErrorCode.FRAME_SIZE_ERROR),
        (raw_frame(GOAWAY, 0, 1, bytes(8)), ErrorCode.PROTOCOL_ERROR),
        (raw_frame(GOAWAY, 0, 0, bytes(7)), ErrorCode.FRAME_SIZE_ERROR),
    ],
)
def test_bad_control_frames_are_connection_errors(frame: bytes, code: ErrorCode) -> None:
    peer = Peer().handshake()
    peer.send(peer.request(1))
    assert connection_error(peer, frame) == code


def test_priority_frames_are_ignored_and_a_wrong_sized_or_self_dependent_one_resets_its_stream() -> None:
    peer = Peer().handshake()
    assert peer.send(raw_frame(PRIORITY, 0, 1, bytes(5))) == []
    peer.send(raw_frame(PRIORITY, 0, 3, bytes(4)), raw_frame(PRIORITY, 0, 5, u32(5) + b"\x10"))
    peer.send(raw_frame(HEADERS, END_HEADERS | PRIORITY_FLAG, 7, u32(7) + b"\x10" + peer.block()))
    peer.read()
    assert peer.resets() == {
        3: ErrorCode.FRAME_SIZE_ERROR,
        5: ErrorCode.PROTOCOL_ERROR,
        7: ErrorCode.PROTOCOL_ERROR,
    }
    assert [type(e) for e in peer.send(peer.request(9))] == [RequestReceived]  # HPACK kept in step


def test_a_rapid_reset_flood_is_told_to_calm_down() -> None:
    peer = Peer().handshake()
    frames = []
    for stream in range(1, 2 * 2100, 2):
        frames += [peer.request(stream), raw_frame(RST_STREAM, 0, stream, u32(ErrorCode.CANCEL))]
    assert connection_error(peer, *frames) == ErrorCode.ENHANCE_YOUR_CALM


def test_a_ping_is_answered_with_its_payload_and_a_ping_flood_without_streams_strikes_out() -> None:
    peer = Peer().handshake()
    peer.send(raw_frame(PING, 0, 0, b"12345678"))
    [pong] = peer.read()
    assert (pong.kind, pong.flags, pong.payload) == (PING, ACK, b"12345678")
    peer.send(raw_frame(PING, 0, 0, bytes(8)), raw_frame(PING, 0, 0, bytes(8)))
    assert connection_error(peer, raw_frame(PING, 0, 0, bytes(8))) == ErrorCode.ENHANCE_YOUR_CALM
    assert peer.goaway().payload[8:] == b"too_many_pings"  # type: ignore[union-attr]


@pytest.mark.parametrize("unfinished", ["frame", "header block"])
def test_a_frame_or_header_block_left_unfinished_ends_the_connection_even_trickled(unfinished: str) -> None:
    """Half a frame, then a byte every 5 s: dropped 30 s after the frame began (it was held
    until keepalive gave up, two hours, and a connection that has spoken is never evicted)."""
    peer = Peer(frame_timeout_s=30.0).handshake()
    assert peer.engine.tick() == 30.0  # no frame pending: the next check comes anyway
    if unfinished == "frame":
        begun, trickle = raw_frame(DATA, 0, 1, bytes(1000))[:100], [b"\x00"] * 10
    else:
        begun, trickle = raw_frame(HEADERS, 0, 1, b"\x82"), [raw_frame(CONTINUATION, 0, 1)] * 10
    peer.send_raw(begun)
    for piece in trickle:
        peer.now += 5.0
        if peer.now >= 30.0:
            break
        peer.send_raw(piece)
        assert peer.engine.tick() == pytest.approx(30.0 - peer.now)
    assert peer.engine.tick() is None and peer.engine.closed
    peer.read()
    assert peer.goaway().payload[8:] == b"a frame was left unfinished"  # type: ignore[union-attr]


def test_whole_frames_sent_slowly_never_count_as_unfinished() -> None:
    peer = Peer(frame_timeout_s=30.0, keepalive_time_s=7200.0).handshake()
    for _ in range(20):
        peer.now += 10.0
        peer.send(raw_frame(PING, 0, 0, bytes(8)))
        peer.send(peer.request(1 + 2 * _, end_stream=True))  # calls open: pings are fine
        assert peer.engine.tick() == 30.0 and not peer.engine.closed


def test_keepalive_pings_a_quiet_peer_and_drops_one_that_does_not_answer() -> None:
    peer = Peer(keepalive_time_s=5.0, keepalive_timeout_s=2.0).handshake()
    assert peer.engine.tick() == 5.0
    peer.now = 5.0
    assert peer.engine.tick() == 2.0
    [ping] = peer.read()
    assert ping.kind == PING and ping.flags == 0
    peer.send(raw_frame(PING, ACK, 0, ping.payload))
    peer.now = 7.0
    assert peer.engine.tick() == 3.0  # answered: quiet since 5.0
    peer.now = 10.0
    peer.engine.tick()
    peer.now = 12.0
    assert peer.engine.tick() is None and peer.engine.closed
    assert peer.read()[-1].kind == GOAWAY


def test_a_graceful_goaway_finishes_open_streams_refuses_new_ones_then_closes() -> None:
    peer = Peer().handshake()
    peer.send(peer.request(1, end_stream=True))
    peer.engine.go_away()
    goaway = peer.read()[-1]
    assert goaway.kind == GOAWAY and goaway.payload[:8] == u32(1) + u32(0)
    assert peer.send(peer.request(3)) == [] and peer.resets() == {}
    peer.read()
    assert peer.resets() == {3: ErrorCode.REFUSED_STREAM} and not peer.engine.closed
    peer.engine.send_headers(1, b"\x88", end_stream=True)
    assert peer.engine.closed


def test_a_peers_goaway_closes_the_connection_once_its_streams_end() -> None:
    peer = Peer().handshake()
    peer.send(peer.request(1, end_stream=True), raw_frame(GOAWAY, 0, 0, u32(0) + u32(0)))
    assert not peer.engine.closed
    peer.engine.send_headers(1, b"\x88", end_stream=True)
    assert peer.engine.closed


def test_goaway_debug_data_is_plain_text() -> None:
    peer = Peer().handshake()
    connection_error(peer, raw_frame(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff"))
    debug = peer.goaway().payload[8:]  # type: ignore[union-attr]
    assert debug.isascii() and b"<" not in debug and debug.startswith(b"header block not decodable")


def test_after_a_connection_error_nothing_more_is_read_or_sent() -> None:
    peer = Peer().handshake()
    peer.send(peer.request(1))
    connection_error(peer, raw_frame(PING, 0, 0, bytes(3)))
    assert peer.send(peer.request(3)) == []
    peer.engine.send_headers(1, b"\x88", end_stream=True)
    assert peer.read() == []
