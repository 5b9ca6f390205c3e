"""gRPC's Length-Prefixed-Message framing (a compressed flag and a 4-byte length before each
message), cut out of a stream's DATA payloads without I/O.

Split from the call so the call keeps its lifecycle (handler, inflation, answers) and this
keeps the byte arithmetic; the call passes its message sink to each :meth:`MessageFramer.feed`
rather than storing it, so the two never reference each other.
"""

from __future__ import annotations

from collections.abc import Callable

from ortserve.server.grpc.errors import GrpcAbort, StatusCode

__all__ = ["MessageFramer", "MessageSink", "whole_message"]

_PREFIX = 5

MessageSink = Callable[[bytes | bytearray | memoryview, bool], None]
"""Takes one whole message and whether it is compressed; may raise GrpcAbort."""


class MessageFramer:
    """Reassembles one stream's messages, refusing any longer than ``max_message`` from its
    prefix alone (nothing of it is buffered).

    A message that lies whole in one payload is handed on as a view of it (no copy); one split
    over several payloads is gathered into its own buffer, so it never pins a read buffer.
    """

    __slots__ = ("_compressed", "_length", "_max_message", "_partial", "_prefix")

    def __init__(self, max_message: int) -> None:
        self._max_message = max_message
        self._prefix = b""
        self._length = -1
        self._partial = bytearray()
        self._compressed = False

    @property
    def held(self) -> int:
        """Bytes buffered of a message not yet whole."""
        return len(self._prefix) + len(self._partial)

    @property
    def inside_message(self) -> bool:
        """Whether the bytes so far end inside a message (its prefix or body)."""
        return self._length >= 0 or bool(self._prefix)

    def feed(self, payload: memoryview, on_message: MessageSink) -> None:
        """Take one DATA payload; ``on_message`` gets each message it completes, in order.

        Raises:
            GrpcAbort: an invalid compressed flag, a message over the limit, or what
                ``on_message`` raises.
        """
        pos, end = 0, len(payload)
        while pos < end:
            if self._length < 0:
                need = _PREFIX - len(self._prefix)
                self._prefix += bytes(payload[pos : pos + need])
                pos += need
                if len(self._prefix) < _PREFIX:
                    return
                self._begin(self._prefix)
                self._prefix = b""
                if self._length == 0:
                    self._length = -1
                    on_message(b"", self._compressed)
                continue
            take = min(self._length - len(self._partial), end - pos)
            if take == self._length:  # the whole message is in this payload: no copy
                self._length = -1
                on_message(payload[pos : pos + take], self._compressed)
            else:
                self._partial += payload[pos : pos + take]
                if len(self._partial) == self._length:
                    data, self._partial = self._partial, bytearray()
                    self._length = -1
                    on_message(data, self._compressed)
            pos += take

    def _begin(self, prefix: bytes) -> None:
        length = int.from_bytes(prefix[1:], "big")
        if prefix[0] > 1:
            raise GrpcAbort(StatusCode.INTERNAL, f"invalid message compression flag {prefix[0]}")
        if length > self._max_message:
            raise GrpcAbort(
                StatusCode.RESOURCE_EXHAUSTED,
                f"received message larger than max ({length} vs. {self._max_message})",
            )
        self._compressed = prefix[0] == 1
        self._length = length


def whole_message(payload: memoryview) -> memoryview | None:
    """The message when ``payload`` is exactly one uncompressed length-prefixed message; None
    for anything else (a compressed message inflates in its call)."""
    size = len(payload) - _PREFIX
    if size < 0 or payload[0] != 0 or int.from_bytes(payload[1:_PREFIX], "big") != size:
        return None
    return payload[_PREFIX:]
