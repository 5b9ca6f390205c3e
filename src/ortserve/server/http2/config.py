"""The limits and timers of one server-side HTTP/2 connection."""

from __future__ import annotations

from dataclasses import dataclass

from ortserve.server.http2.frames import MAX_WINDOW

__all__ = ["EngineConfig"]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What the engine allows a peer, and when it pings one.

    Every buffer the engine keeps is bounded by these: a partial frame by ``max_frame_size``,
    an open header block by ``2 * max_header_list_bytes``, the streams by
    ``max_concurrent_streams``, and what the peer may send by the windows.
    """

    max_concurrent_streams: int = 100
    max_header_list_bytes: int = 64 * 1024
    stream_window: int = 4 << 20
    """SETTINGS_INITIAL_WINDOW_SIZE: what a peer may send on a stream before we reopen it."""
    connection_window: int = 16 << 20
    max_frame_size: int = 1 << 20
    """SETTINGS_MAX_FRAME_SIZE: the largest frame we accept."""
    max_continuation_frames: int = 64
    """A header block may span this many CONTINUATION frames at most (h2's cap too). Real
    clients need one or two; the limit stops a flood of empty frames that would otherwise never
    end the block (CVE-2024-27316's class)."""
    keepalive_time_s: float = 7200.0
    """Quiet seconds before we ping the peer."""
    keepalive_timeout_s: float = 20.0
    """Seconds our ping may go unanswered before the connection is dropped."""
    preface_timeout_s: float = 10.0
    frame_timeout_s: float = 30.0
    """Seconds a frame (or a header block of several) may take to arrive whole once begun: a
    1 MiB frame at 35 KB/s; a peer that stops halfway is dropped, not held until keepalive."""
    request_grace_s: float = 10.0
    """A stream's request (its DATA up to END_STREAM) may take this long plus one second per
    ``request_min_rate`` bytes received, and ``request_timeout_s`` at most: a stream opened and
    left silent held its connection (and a place under the connection cap) until keepalive."""
    request_min_rate: float = 500.0
    request_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if not 0 < self.connection_window <= MAX_WINDOW or not 0 < self.stream_window <= MAX_WINDOW:
            raise ValueError("windows must be between 1 and 2^31-1")
