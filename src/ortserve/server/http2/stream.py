"""One HTTP/2 stream's state (RFC 9113 5.1) as the engine keeps it: both directions, both windows,
and what waits to be sent.

A stream in the engine's table is open or half-closed; once both sides are done, or it is
reset, it leaves the table and is "closed". Idle streams are never stored: a stream id above
the highest one seen is idle.
"""

from __future__ import annotations

from collections import deque

__all__ = ["Stream"]


class Stream:
    """The engine's record of one stream; only the engine writes it."""

    __slots__ = (
        "local_closed",
        "outbound",
        "outbound_bytes",
        "recv_window",
        "remote_closed",
        "request_bytes",
        "request_since",
        "send_window",
        "stream_id",
        "unconsumed",
    )

    def __init__(self, stream_id: int, send_window: int, recv_window: int) -> None:
        self.stream_id = stream_id
        self.send_window = send_window
        """What the peer lets us send on this stream."""
        self.recv_window = recv_window
        """What we let the peer send on this stream."""
        self.remote_closed = False
        """The peer ended its side (END_STREAM), or was told to stop (RST_STREAM NO_ERROR)."""
        self.local_closed = False
        """Our end of the stream is queued: nothing more may be sent after it."""
        self.unconsumed = False
        """Data was handed to the application and it has not said it took it: no window back."""
        self.outbound: deque[tuple[bytes | memoryview, bool]] | None = None
        """Payloads waiting for flow-control window: (bytes, is a closing header block); made
        when the first one has to wait (an answer that fits the windows never does)."""
        self.outbound_bytes = 0
        """DATA bytes in :attr:`outbound`."""
        self.request_since = 0.0
        """When the stream opened (its request's arrival deadline counts from it)."""
        self.request_bytes = 0
        """DATA bytes the peer sent on the stream."""
