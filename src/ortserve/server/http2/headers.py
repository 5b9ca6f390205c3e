"""HPACK request header blocks (RFC 7541) decoded, checked against HTTP/2's request rules, and cached.

Decoding goes through the ``hpack`` library, with a cache in front: after a client's first
request its header block is usually made of fields that refer to the decoder's dynamic table
without changing it, so the same bytes always decode to the same head. Such blocks are
remembered (as whatever the application made of them) until a block that may change the table
arrives. That saves about 25 us of pure-Python decoding per request. Blocks of indexed fields
and of literals "without indexing" qualify (nghttp2 sends ``:path`` that way).

Responses are the application's business; :func:`literal_field` encodes fields that never
touch the peer's dynamic table, so response blocks can be fixed bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeAlias, TypeVar, cast

import hpack
from hpack.exceptions import HPACKError

__all__ = [
    "Fields",
    "HeaderBlockDecoder",
    "HeaderError",
    "MalformedHeaders",
    "check_request_fields",
    "literal_field",
    "literal_indexed_name",
]

Fields: TypeAlias = "list[tuple[bytes, bytes]]"
_H = TypeVar("_H")
_CACHE_ENTRIES = 64
_PSEUDO = frozenset((b":method", b":path", b":scheme", b":authority"))
# Fields HTTP/2 forbids in a request (RFC 9113 8.2.2); ``te`` is allowed only as "trailers".
_CONNECTION_SPECIFIC = frozenset(
    (b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade")
)


class HeaderError(Exception):
    """The header block cannot be decoded: the connection's HPACK state is lost (COMPRESSION_ERROR)."""


class MalformedHeaders(Exception):
    """The fields decode but do not form a valid request (a stream error, PROTOCOL_ERROR)."""


def check_request_fields(fields: Fields) -> None:
    """RFC 9113 8.3.1 and 8.2: pseudo-headers first, known and once each; lowercase names;
    no connection-specific fields; ``:method``, ``:scheme`` and a non-empty ``:path``.

    Raises:
        MalformedHeaders: a rule is broken.
    """
    seen: set[bytes] = set()
    regular = False
    has_path = False
    for name, value in fields:
        if name.startswith(b":"):
            if regular or name in seen or name not in _PSEUDO:
                raise MalformedHeaders("misplaced, repeated or unknown pseudo-header")
            seen.add(name)
            has_path = has_path or (name == b":path" and bool(value))
            continue
        regular = True
        if name != name.lower():
            raise MalformedHeaders("header names must be lowercase")
        if name in _CONNECTION_SPECIFIC or (name == b"te" and value != b"trailers"):
            raise MalformedHeaders("connection-specific header")
    if b":method" not in seen or b":scheme" not in seen or not has_path:
        raise MalformedHeaders("a request needs :method, :scheme and a non-empty :path")


class HeaderBlockDecoder(Generic[_H]):
    """One connection's HPACK decoder: header blocks to the application's request heads.

    Args:
        max_header_list_size: the largest decoded header list accepted (bytes, RFC 7541 size).
        interpret: makes the application's head of checked fields; may raise
            :class:`MalformedHeaders`. Its results are cached, so it must be pure.
    """

    def __init__(self, max_header_list_size: int, interpret: Callable[[Fields], _H]) -> None:
        self._decoder = hpack.Decoder(max_header_list_size=max_header_list_size)
        self._interpret = interpret
        self._cache: dict[bytes, _H] = {}

    def decode(self, block: bytes) -> _H:
        """The request head of one complete header block.

        Raises:
            HeaderError: the block is not valid HPACK, or too large (the connection must end).
            MalformedHeaders: the fields do not form a valid request.
        """
        head = self._cache.get(block)
        if head is not None:
            return head
        fields, cacheable = self._decode(block)
        check_request_fields(fields)
        head = self._interpret(fields)
        if cacheable and len(self._cache) < _CACHE_ENTRIES:
            self._cache[block] = head
        return head

    def check_trailers(self, block: bytes) -> None:
        """Decode a request's trailers (which are not kept) and check them (RFC 9113 8.1).

        Raises:
            HeaderError: the block is not valid HPACK.
            MalformedHeaders: a pseudo-header or an uppercase name.
        """
        fields, _ = self._decode(block)
        for name, _value in fields:
            if name.startswith(b":") or name != name.lower():
                raise MalformedHeaders("trailers with a pseudo-header or an uppercase name")

    def decode_and_discard(self, block: bytes) -> None:
        """Keep the HPACK state in step for a block whose stream is refused, closed, or trailers.

        Raises:
            HeaderError: the block is not valid HPACK.
        """
        self._decode(block)

    def _decode(self, block: bytes) -> tuple[Fields, bool]:
        """The fields, and True when the block left the dynamic table as it was."""
        if block and block[0] & 0xE0 == 0x20 and _leading_size_updates(block) > 2:
            # RFC 7541 4.2 allows two (the smallest size, then the final one); the decoder
            # would take any number, each an instruction that adds no field to the list.
            raise HeaderError("more than two dynamic table size updates at the start of a block")
        try:
            fields = cast("list[tuple[bytes, bytes]]", self._decoder.decode(block, raw=True))
        except HPACKError as exc:
            # The library's text may hold Python reprs; the peer gets the error's kind only.
            raise HeaderError(f"invalid HPACK block ({type(exc).__name__})") from None
        if _leaves_table_alone(block):
            return fields, True
        self._cache.clear()  # the dynamic table may have changed under every cached block
        return fields, False


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


def _leading_size_updates(block: bytes) -> int:
    """How many dynamic table size updates open the block, counted up to three."""
    count = i = 0
    end = len(block)
    while i < end and block[i] & 0xE0 == 0x20 and count < 3:
        count += 1
        try:
            i = _skip_integer(block, i, 5)
        except IndexError:
            break
    return count


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
        while True:
            byte = block[i]
            length += (byte & 0x7F) << shift
            shift += 7
            i += 1
            if not byte & 0x80:
                break
        return i + length
    return i + 1 + length


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


def literal_field(name: bytes, value: bytes) -> bytes:
    """A literal field without indexing and with a literal name (RFC 7541 6.2.2)."""
    return b"\x00" + _length(len(name)) + name + _length(len(value)) + value


def literal_indexed_name(index: int, value: bytes) -> bytes:
    """A literal field without indexing whose name is static-table entry ``index`` (< 15)."""
    return bytes((index,)) + _length(len(value)) + value
