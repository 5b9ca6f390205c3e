"""The engine's deadline for a stream's request to arrive (DATA up to END_STREAM): a grace, a
minimum rate after it, an absolute cap, on a hand-moved clock."""

from __future__ import annotations

import pytest

from http2_peer import DATA, END_STREAM, RST_STREAM, Peer, raw_frame

RULES = {"request_grace_s": 10.0, "request_min_rate": 500.0, "request_timeout_s": 60.0}


def test_a_stream_opened_and_left_silent_is_late_after_the_grace() -> None:
    peer = Peer(**RULES).handshake()
    peer.send(peer.request(1))
    assert peer.engine.awaiting_requests == 1
    assert peer.engine.tick() == pytest.approx(10.0)  # the timer comes for it
    peer.now = 9.9
    assert peer.engine.expired_requests() == []
    peer.now = 10.0
    assert peer.engine.expired_requests() == [1]
    assert peer.engine.expired_requests() == []  # reported once
    assert peer.engine.awaiting_requests == 0 and peer.engine.open_streams == 1  # the application ends it


def test_each_byte_buys_time_at_the_minimum_rate() -> None:
    peer = Peer(**RULES).handshake()
    peer.send(peer.request(1))
    peer.now = 5.0
    peer.send(raw_frame(DATA, 0, 1, bytes(2500)))  # 5 s more: due at 15 s
    peer.now = 14.9
    assert peer.engine.expired_requests() == []
    assert peer.engine.tick() == pytest.approx(0.1)
    peer.now = 15.0
    assert peer.engine.expired_requests() == [1]


def test_a_trickle_above_the_rate_is_late_at_the_absolute_cap() -> None:
    peer = Peer(**RULES).handshake()
    peer.send(peer.request(1))
    for second in range(1, 60):
        peer.now = float(second)
        peer.send(raw_frame(DATA, 0, 1, bytes(600)))  # 600 B/s: each byte buys 2 ms
        assert peer.engine.expired_requests() == []
    peer.now = 60.0
    assert peer.engine.expired_requests() == [1]


def test_a_request_that_ends_in_time_is_no_longer_timed() -> None:
    peer = Peer(**RULES).handshake()
    peer.send(peer.request(1), peer.request(3))
    peer.send(raw_frame(DATA, END_STREAM, 1, b"x"))
    peer.send(raw_frame(RST_STREAM, 0, 3, (8).to_bytes(4, "big")))  # the client cancelled it
    assert peer.engine.awaiting_requests == 0
    peer.send(peer.request(5, end_stream=True))  # whole at once: never timed
    peer.now = 1000.0
    assert peer.engine.awaiting_requests == 0 and peer.engine.expired_requests() == []


def test_a_stream_whose_requests_come_at_their_own_pace_is_not_timed() -> None:
    peer = Peer(**RULES).handshake()
    peer.send(peer.request(1))
    peer.engine.open_ended(1)  # a streaming call
    peer.now = 1000.0
    assert peer.engine.expired_requests() == []


def test_time_the_application_did_not_read_is_not_the_peers() -> None:
    peer = Peer(**RULES).handshake()
    peer.send(peer.request(1))
    peer.now = 9.0
    peer.engine.postpone_requests(5.0)  # the loop was saturated: reading was paused 5 s
    peer.now = 14.9
    assert peer.engine.expired_requests() == []
    peer.now = 15.0
    assert peer.engine.expired_requests() == [1]


def test_while_the_application_does_not_read_a_late_request_brings_no_tick_every_millisecond() -> None:
    # Parked by the intake governor, the connection's requests are not timed (their clocks are
    # postponed when it reads again): the timer follows the frame and keepalive clocks only.
    peer = Peer(**RULES).handshake()
    peer.send(peer.request(1))
    peer.now = 12.0  # past the 10 s grace, not yet expired: the application is not reading
    assert peer.engine.tick() == pytest.approx(0.001)
    untimed = peer.engine.tick(requests_timed=False)
    assert untimed is not None and untimed > 1.0
    peer.engine.postpone_requests(12.0)  # read again: the 12 s parked were the server's
    assert peer.engine.tick() == pytest.approx(10.0)
