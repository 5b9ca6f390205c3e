"""gRPC request heads from HPACK header blocks, and the response header blocks the server sends.

Decoding goes through the ``hpack`` library, with a cache in front: after a client's first
call its header block is usually made of fields that refer to the decoder's dynamic table
without changing it, so the same bytes always decode to the same head.
Such blocks are remembered until a block that may change the table arrives. That saves
about 25 us of pure-Python decoding per call. Blocks of indexed fields and of literals "without
indexing" qualify (nghttp2 sends ``:path`` that way).

Responses never use the dynamic table (literal fields "without indexing"), so their blocks
are fixed bytes and the peer's table size settings never matter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import cast
from urllib.parse import quote

import hpack
from hpack.exceptions import HPACKError

from ortserve.server.grpc.errors import StatusCode

__all__ = [
    "RESPONSE_HEADERS",
    "HeaderBlockDecoder",
    "HeaderError",
    "MalformedRequest",
    "RequestHead",
    "trailers",
    "trailers_only",
]

_TIMEOUT = re.compile(rb"(\d{1,8})([HMSmun])")
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
# Headers gRPC itself consumes; everything else is call metadata.
_RESERVED = frozenset(
    (b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding", b"user-agent")
)
# Fields HTTP/2 forbids in a request (RFC 9113 8.2.2); ``te`` is allowed only as "trailers".
_CONNECTION_SPECIFIC = frozenset(
    (b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade")
)
_CACHE_ENTRIES = 64
# grpc-message is cut to this many encoded bytes: clients bound the size of trailers
# (grpc-core: 8 KiB by default), and a message that echoes a long name must not break the call.
_MAX_MESSAGE_BYTES = 2048
_MESSAGE_SAFE = " !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~"


class HeaderError(Exception):
    """The header block cannot be decoded: the connection's HPACK state is lost (COMPRESSION_ERROR)."""


class MalformedRequest(Exception):
    """The request's headers break HTTP/2's rules for a request (a stream error, PROTOCOL_ERROR)."""


@dataclass(frozen=True, slots=True)
class RequestHead:
    """What the server needs from a call's headers."""

    method: bytes
    path: str
    content_type: bytes
    timeout_s: float | None
    """The ``grpc-timeout`` header in seconds; None when the call has no deadline."""
    encoding: bytes
    """``grpc-encoding`` of the request messages (``identity`` when absent)."""
    metadata: tuple[tuple[str, str], ...]

    def refusal(self) -> tuple[int, StatusCode, str] | None:
        """HTTP status, gRPC status and message when the request cannot be a gRPC call."""
        if self.method != b"POST":
            return 405, StatusCode.UNIMPLEMENTED, "gRPC calls use POST"
        if not self.is_grpc:
            return (
                415,
                StatusCode.INTERNAL,
                f"content-type {self.content_type.decode('latin-1')!r} is not gRPC",
            )
        return None

    @property
    def is_grpc(self) -> bool:
        """``application/grpc`` or a subtype such as ``application/grpc+proto``."""
        kind = self.content_type
        return kind == b"application/grpc" or kind.startswith((b"application/grpc+", b"application/grpc;"))


class HeaderBlockDecoder:
    """One connection's HPACK decoder, turning header blocks into :class:`RequestHead` s.

    Args:
        max_header_list_size: the largest decoded header list accepted (bytes, RFC 7541 size).
    """

    def __init__(self, max_header_list_size: int) -> None:
        self._decoder = hpack.Decoder(max_header_list_size=max_header_list_size)
        self._cache: dict[bytes, RequestHead] = {}
        self._fields: list[tuple[bytes, bytes]] = []

    def decode(self, block: bytes) -> RequestHead:
        """The request head of one complete header block.

        Raises:
            HeaderError: the block is not valid HPACK, or too large (the connection must end).
            MalformedRequest: the headers decode but do not form a valid request.
        """
        head = self._cache.get(block)
        if head is not None:
            return head
        cacheable = self._decode(block)
        head = _request_head(self._fields)
        if cacheable and len(self._cache) < _CACHE_ENTRIES:
            self._cache[block] = head
        return head

    def decode_and_discard(self, block: bytes) -> None:
        """Keep the HPACK state in step for a block whose stream is refused or already closed.

        Raises:
            HeaderError: the block is not valid HPACK.
        """
        self._decode(block)

    def _decode(self, block: bytes) -> bool:
        """Decode into ``_fields``; True when the block left the dynamic table as it was."""
        try:
            self._fields = cast(list[tuple[bytes, bytes]], self._decoder.decode(block, raw=True))
        except HPACKError as exc:
            raise HeaderError(
                f"invalid HPACK block ({type(exc).__name__})"
            ) from None  # hpack's text has reprs
        if _leaves_table_alone(block):
            return True
        self._cache.clear()  # the dynamic table may have changed under every cached block
        return False


def _leaves_table_alone(block: bytes) -> bool:
    """No field adds to the dynamic table and no size update changes it (RFC 7541 6.1-6.3).

    Such a block decodes the same way for as long as the table stays as it is.
    """
    i, end = 0, len(block)
    try:
        while i < end:
            byte = block[i]
            if byte & 0x80:  # indexed field
                i = _skip_integer(block, i, 7)
            elif byte & 0xE0 == 0 or byte & 0xF0 == 0x10:  # literal without / never indexed
                named = byte & 0x0F == 0
                i = _skip_integer(block, i, 4)
                if named:
                    i = _skip_string(block, i)
                i = _skip_string(block, i)
            else:  # literal with incremental indexing, or a table size update
                return False
    except IndexError:
        return False
    return i == end


def _skip_integer(block: bytes, i: int, prefix_bits: int) -> int:
    """Index after an HPACK integer starting at ``i``."""
    mask = (1 << prefix_bits) - 1
    if block[i] & mask != mask:
        return i + 1
    i += 1
    while block[i] & 0x80:
        i += 1
    return i + 1


def _skip_string(block: bytes, i: int) -> int:
    """Index after an HPACK string literal starting at ``i``."""
    length = block[i] & 0x7F
    if length == 0x7F:
        shift, i = 0, i + 1
        length = 0x7F
        while True:
            byte = block[i]
            length += (byte & 0x7F) << shift
            shift += 7
            i += 1
            if not byte & 0x80:
                break
        return i + length
    return i + 1 + length


def _request_head(fields: list[tuple[bytes, bytes]]) -> RequestHead:
    pseudo: dict[bytes, bytes] = {}
    content_type = b""
    timeout_s: float | None = None
    encoding = b"identity"
    metadata: list[tuple[str, str]] = []
    regular_seen = False
    for name, value in fields:
        if name.startswith(b":"):
            if (
                regular_seen
                or name in pseudo
                or name not in (b":method", b":path", b":scheme", b":authority")
            ):
                raise MalformedRequest(f"misplaced, repeated or unknown pseudo-header {name!r}")
            pseudo[name] = value
            continue
        regular_seen = True
        if name != name.lower():
            raise MalformedRequest("header names must be lowercase")
        if name in _CONNECTION_SPECIFIC or (name == b"te" and value != b"trailers"):
            raise MalformedRequest(f"connection-specific header {name!r}")
        if name == b"content-type":
            content_type = value
        elif name == b"grpc-timeout":
            timeout_s = _timeout(value)
        elif name == b"grpc-encoding":
            encoding = value
        elif name not in _RESERVED:
            metadata.append((name.decode("latin-1"), value.decode("latin-1")))
    if b":method" not in pseudo or not pseudo.get(b":path") or b":scheme" not in pseudo:
        raise MalformedRequest("a request needs :method, :scheme and a non-empty :path")
    return RequestHead(
        pseudo[b":method"],
        pseudo[b":path"].decode("latin-1"),
        content_type,
        timeout_s,
        encoding,
        tuple(metadata),
    )


def _timeout(value: bytes) -> float:
    match = _TIMEOUT.fullmatch(value)
    if match is None:
        raise MalformedRequest(f"malformed grpc-timeout {value!r}")
    return int(match.group(1)) * _TIMEOUT_UNITS[match.group(2)]


# -- response blocks --------------------------------------------------------------------
def _length(value: int) -> bytes:
    """An HPACK integer with a 7-bit prefix and the Huffman bit clear (a string length)."""
    if value < 0x7F:
        return bytes((value,))
    out = bytearray((0x7F,))
    value -= 0x7F
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """A literal field without indexing and with a literal name (RFC 7541 6.2.2)."""
    return b"\x00" + _length(len(name)) + name + _length(len(value)) + value


_STATUS_200 = b"\x88"  # static table entry 8
_CONTENT_TYPE = _literal(b"content-type", b"application/grpc")
ACCEPT_ENCODING = b"identity,deflate,gzip"
RESPONSE_HEADERS = _STATUS_200 + _CONTENT_TYPE + _literal(b"grpc-accept-encoding", ACCEPT_ENCODING)
"""The first header block of every answer that has messages."""
OK_TRAILERS = _literal(b"grpc-status", b"0")


def _status(http_status: int) -> bytes:
    if http_status == 200:
        return _STATUS_200
    # Literal without indexing, name from static entry 8 (":status").
    return b"\x08" + _length(3) + str(http_status).encode()


def _message(message: str) -> bytes:
    """``grpc-message`` is percent-encoded UTF-8 (gRPC over HTTP/2, "Responses"), cut to a bound.

    The cut is made on the text, before encoding, so it never splits a character or an escape.
    """
    encoded = quote(message, safe=_MESSAGE_SAFE)
    while len(encoded) > _MAX_MESSAGE_BYTES:
        message = message[: max(0, len(message) * _MAX_MESSAGE_BYTES // len(encoded) - 1)]
        encoded = quote(message, safe=_MESSAGE_SAFE)
    return encoded.encode("ascii")


def trailers(code: int, message: str = "", extra: tuple[tuple[str, str], ...] = ()) -> bytes:
    """The closing header block: ``grpc-status``, ``grpc-message`` and any extra trailers."""
    if code == 0 and not message and not extra:
        return OK_TRAILERS
    block = [_literal(b"grpc-status", str(code).encode())]
    if message:
        block.append(_literal(b"grpc-message", _message(message)))
    block.extend(_literal(name.encode("ascii"), value.encode("latin-1")) for name, value in extra)
    return b"".join(block)


def trailers_only(
    code: int, message: str, extra: tuple[tuple[str, str], ...] = (), http_status: int = 200
) -> bytes:
    """A whole answer in one block, for calls that fail before any message is sent."""
    return _status(http_status) + _CONTENT_TYPE + trailers(code, message, extra)
