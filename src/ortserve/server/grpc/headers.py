"""What gRPC makes of a request's header fields, and the header blocks the server answers with.

HPACK decoding, its cache and HTTP/2's request rules are the engine's
(:mod:`~ortserve.server.http2.headers`); this module gives the checked fields their gRPC
meaning: the method's path, the deadline, the message encoding and the call's metadata.

Responses never use the dynamic table (literal fields "without indexing"), so their blocks
are fixed bytes and the peer's table size settings never matter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote

from ortserve.server.grpc.errors import StatusCode
from ortserve.server.http2.headers import Fields, MalformedHeaders, literal_field, literal_indexed_name

__all__ = [
    "ACCEPT_ENCODING",
    "OK_TRAILERS",
    "RESPONSE_HEADERS",
    "RequestHead",
    "request_head",
    "trailers",
    "trailers_only",
]

_TIMEOUT = re.compile(rb"(\d{1,8})([HMSmun])")
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
# Headers gRPC itself consumes; everything else is call metadata.
_RESERVED = frozenset(
    (b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding", b"user-agent")
)
# grpc-message is cut to this many encoded bytes: clients bound the size of trailers
# (grpc-core: 8 KiB by default), and a message that echoes a long name must not break the call.
_MAX_MESSAGE_BYTES = 2048
_MESSAGE_SAFE = " !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~"


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

    def metadata_value(self, name: str) -> str | None:
        """The first value of a metadata key (lowercase); None when the call has none (an
        edge refusal reads the tenant's key here before the call is made)."""
        for key, value in self.metadata:
            if key == name:
                return value
        return None

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


def request_head(fields: Fields) -> RequestHead:
    """The gRPC meaning of a request's fields (already checked against HTTP/2's rules).

    Raises:
        MalformedHeaders: ``grpc-timeout`` is malformed.
    """
    method = path = b""
    content_type = b""
    timeout_s: float | None = None
    encoding = b"identity"
    metadata: list[tuple[str, str]] = []
    for name, value in fields:
        if name.startswith(b":"):
            if name == b":method":
                method = value
            elif name == b":path":
                path = value
        elif name == b"content-type":
            content_type = value
        elif name == b"grpc-timeout":
            timeout_s = _timeout(value)
        elif name == b"grpc-encoding":
            encoding = value
        elif name not in _RESERVED:
            metadata.append((name.decode("latin-1"), value.decode("latin-1")))
    return RequestHead(method, path.decode("latin-1"), content_type, timeout_s, encoding, tuple(metadata))


def _timeout(value: bytes) -> float:
    match = _TIMEOUT.fullmatch(value)
    if match is None:
        raise MalformedHeaders("malformed grpc-timeout")
    return int(match.group(1)) * _TIMEOUT_UNITS[match.group(2)]


# -- response blocks --------------------------------------------------------------------
_STATUS_200 = b"\x88"  # static table entry 8
_CONTENT_TYPE = literal_field(b"content-type", b"application/grpc")
ACCEPT_ENCODING = b"identity,deflate,gzip"
RESPONSE_HEADERS = _STATUS_200 + _CONTENT_TYPE + literal_field(b"grpc-accept-encoding", ACCEPT_ENCODING)
"""The first header block of every answer that has messages."""
OK_TRAILERS = literal_field(b"grpc-status", b"0")


def _status(http_status: int) -> bytes:
    if http_status == 200:
        return _STATUS_200
    # Literal without indexing, name from static entry 8 (":status").
    return literal_indexed_name(8, str(http_status).encode())


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
    block = [literal_field(b"grpc-status", str(code).encode())]
    if message:
        block.append(literal_field(b"grpc-message", _message(message)))
    block.extend(literal_field(name.encode("ascii"), value.encode("latin-1")) for name, value in extra)
    return b"".join(block)


def trailers_only(
    code: int, message: str, extra: tuple[tuple[str, str], ...] = (), http_status: int = 200
) -> bytes:
    """A whole answer in one block, for calls that fail before any message is sent."""
    return _status(http_status) + _CONTENT_TYPE + trailers(code, message, extra)
