"""HPACK request heads (with a cache that never answers for a table that has changed) and response blocks."""

from __future__ import annotations

from urllib.parse import unquote

import hpack
import pytest

from ortserve.server.grpc.headers import RESPONSE_HEADERS, RequestHead, request_head, trailers, trailers_only
from ortserve.server.http2.headers import HeaderBlockDecoder, HeaderError, MalformedHeaders

REQUEST = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", b"/pkg.Service/Method"),
    (b":authority", b"localhost"),
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
]


def string(value: bytes) -> bytes:
    """An HPACK string literal, no Huffman (RFC 7541 5.2); multi-byte lengths past 126."""
    if len(value) < 0x7F:
        return bytes((len(value),)) + value
    rest, out = len(value) - 0x7F, bytearray((0x7F,))
    while rest >= 0x80:
        out.append((rest & 0x7F) | 0x80)
        rest >>= 7
    return bytes((*out, rest)) + value


def literal(name: bytes, value: bytes, first: int = 0x00) -> bytes:
    """A literal field with a literal name: 0x00 without indexing, 0x10 never, 0x40 indexed."""
    return bytes((first,)) + string(name) + string(value)


BASE = b"".join(literal(name, value) for name, value in REQUEST)  # leaves the table alone
NEWEST = b"\xbe"  # indexed field 62: the newest entry of the dynamic table


def decoder(max_header_list_size: int = 64 * 1024) -> HeaderBlockDecoder[RequestHead]:
    return HeaderBlockDecoder(max_header_list_size, request_head)


def test_a_block_of_plain_literals_decodes_to_the_request_head() -> None:
    block = BASE + literal(b"x-user", b"alice") + literal(b"grpc-timeout", b"250m")
    head = decoder().decode(block + literal(b"grpc-encoding", b"gzip"))
    assert (head.method, head.path, head.content_type) == (
        b"POST",
        "/pkg.Service/Method",
        b"application/grpc",
    )
    assert head.timeout_s == pytest.approx(0.25)
    assert head.encoding == b"gzip"
    assert head.metadata == (("x-user", "alice"),)  # te, content-type, grpc-* are not metadata
    assert head.is_grpc


def test_indexed_bytes_decode_to_what_the_table_holds_now_not_what_it_held() -> None:
    headers = decoder()
    headers.decode(BASE + literal(b"x-user", b"alice", 0x40))
    probe = BASE + NEWEST
    first = headers.decode(probe)
    assert first.metadata == (("x-user", "alice"),)
    assert headers.decode(probe) is first  # the unchanged table lets the cache answer
    headers.decode(BASE + literal(b"x-user", b"bob", 0x40))  # a new newest entry
    assert headers.decode(probe).metadata == (("x-user", "bob"),)


def test_a_discarded_block_still_moves_the_table_under_the_cache() -> None:
    headers = decoder()
    headers.decode(BASE + literal(b"x-user", b"alice", 0x40))
    probe = BASE + NEWEST
    assert headers.decode(probe).metadata == (("x-user", "alice"),)
    headers.decode_and_discard(BASE + literal(b"x-user", b"carol", 0x40))  # a refused stream's block
    assert headers.decode(probe).metadata == (("x-user", "carol"),)


def test_an_eviction_makes_a_cached_block_invalid_instead_of_answering_from_the_cache() -> None:
    headers = decoder()
    headers.decode(BASE + literal(b"x-user", b"alice", 0x40))
    probe = BASE + NEWEST
    headers.decode(probe)
    headers.decode(b"\x20" + BASE)  # table size update to 0: every entry is evicted
    with pytest.raises(HeaderError):
        headers.decode(probe)


def test_entries_shifted_by_an_addition_give_a_different_head() -> None:
    # The same bytes as the hpack library's encoder sends on a repeated call: all indexed.
    encoder, headers, reference = hpack.Encoder(), decoder(), hpack.Decoder()
    fields = [*REQUEST, (b"x-user", b"alice")]
    repeat = b""
    for _ in range(2):
        repeat = encoder.encode(fields)
        assert headers.decode(repeat).path == "/pkg.Service/Method"
        reference.decode(repeat)
    assert all(byte & 0x80 for byte in repeat)
    change = encoder.encode([*REQUEST, (b"x-user", b"bob")])
    headers.decode(change)
    reference.decode(change)
    # Every dynamic index now points one entry further: :path falls out of the block.
    assert b":path" not in dict(reference.decode(repeat))
    with pytest.raises(MalformedHeaders):
        headers.decode(repeat)


@pytest.mark.parametrize("huffman", [False, True])
def test_never_indexed_fields_with_long_values_are_cached_and_exact(huffman: bool) -> None:
    value = b"v" * 300
    block = hpack.Encoder().encode(
        [*REQUEST, hpack.NeverIndexedHeaderTuple(b"x-long", value)], huffman=huffman
    )
    if not huffman:
        assert block.endswith(literal(b"x-long", value, 0x10)[1:])  # a multi-byte string length
    headers = decoder()
    # The encoder indexes the request's own fields, so the block changes the table: not cached.
    head = headers.decode(block)
    assert head.metadata == (("x-long", "v" * 300),)
    plain = BASE + literal(b"x-long", value, 0x10)
    assert headers.decode(plain) is headers.decode(plain)
    assert headers.decode(plain).metadata == (("x-long", "v" * 300),)


def test_a_block_that_is_not_hpack_is_a_header_error() -> None:
    with pytest.raises(HeaderError):
        decoder().decode(b"\xff\x00")  # index 127: no such entry
    with pytest.raises(HeaderError):
        decoder().decode(BASE + b"\x00\x7f")  # a string length running past the block


def test_a_header_error_goes_to_the_client_without_python_reprs() -> None:
    with pytest.raises(HeaderError) as raised:
        decoder().decode(b"\xff" * 7 + b"\x0f")  # an HPACK integer too long (hpack writes its memoryview)
    assert str(raised.value) == "invalid HPACK block (HPACKDecodingError)"


def test_a_header_list_over_the_limit_is_a_header_error() -> None:
    with pytest.raises(HeaderError):
        decoder(200).decode(BASE + literal(b"x-big", b"b" * 300))


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (b"2H", 7200.0),
        (b"3M", 180.0),
        (b"4S", 4.0),
        (b"250m", 0.25),
        (b"7u", 7e-6),
        (b"9n", 9e-9),
        (b"99999999S", 99_999_999.0),
        (b"0m", 0.0),
    ],
)
def test_grpc_timeout_units(value: bytes, seconds: float) -> None:
    head = decoder().decode(BASE + literal(b"grpc-timeout", value))
    assert head.timeout_s == pytest.approx(seconds)


@pytest.mark.parametrize("value", [b"", b"5", b"S", b"123456789S", b"-1S", b"1.5S", b"1s", b" 1S", b"1S "])
def test_a_malformed_grpc_timeout_is_a_malformed_request(value: bytes) -> None:
    with pytest.raises(MalformedHeaders, match="grpc-timeout"):
        decoder().decode(BASE + literal(b"grpc-timeout", value))


def test_a_call_without_grpc_timeout_has_no_deadline() -> None:
    assert decoder().decode(BASE).timeout_s is None


def without(name: bytes) -> list[tuple[bytes, bytes]]:
    return [(key, value) for key, value in REQUEST if key != name]


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param(without(b":method"), id="no-method"),
        pytest.param(without(b":scheme"), id="no-scheme"),
        pytest.param(without(b":path"), id="no-path"),
        pytest.param([(b":path", b"") if k == b":path" else (k, v) for k, v in REQUEST], id="empty-path"),
        pytest.param([*REQUEST[:2], (b"x-early", b"1"), *REQUEST[2:]], id="pseudo-after-regular"),
        pytest.param([*REQUEST[:3], (b":path", b"/again"), *REQUEST[3:]], id="repeated-pseudo"),
        pytest.param([(b":status", b"200"), *REQUEST], id="response-pseudo"),
        pytest.param([(b":protocol", b"websocket"), *REQUEST], id="unknown-pseudo"),
        pytest.param([*REQUEST, (b"X-Upper", b"1")], id="uppercase-name"),
        pytest.param([*REQUEST, (b"connection", b"keep-alive")], id="connection"),
        pytest.param([*REQUEST, (b"transfer-encoding", b"chunked")], id="transfer-encoding"),
        pytest.param([*REQUEST, (b"upgrade", b"h2c")], id="upgrade"),
        pytest.param([*REQUEST[:-1], (b"te", b"gzip")], id="te-not-trailers"),
    ],
)
def test_a_head_that_breaks_http2_request_rules_is_malformed(fields: list[tuple[bytes, bytes]]) -> None:
    with pytest.raises(MalformedHeaders):
        decoder().decode(b"".join(literal(name, value) for name, value in fields))


def test_authority_and_te_are_optional() -> None:
    fields = [(k, v) for k, v in REQUEST if k not in (b":authority", b"te")]
    assert decoder().decode(b"".join(literal(k, v) for k, v in fields)).path == "/pkg.Service/Method"


@pytest.mark.parametrize(
    ("content_type", "grpc"),
    [
        (b"application/grpc", True),
        (b"application/grpc+proto", True),
        (b"application/grpc;charset=utf-8", True),
        (b"application/grpc-web", False),
        (b"application/json", False),
        (b"", False),
    ],
)
def test_grpc_content_types(content_type: bytes, grpc: bool) -> None:
    fields = [(k, content_type if k == b"content-type" else v) for k, v in REQUEST]
    assert decoder().decode(b"".join(literal(k, v) for k, v in fields)).is_grpc is grpc


# -- response blocks --------------------------------------------------------------------
def decoded(block: bytes) -> list[tuple[str, str]]:
    return [(str(name), str(value)) for name, value in hpack.Decoder().decode(block)]


def test_the_response_head_is_status_200_grpc_and_the_encodings_accepted() -> None:
    assert decoded(RESPONSE_HEADERS) == [
        (":status", "200"),
        ("content-type", "application/grpc"),
        ("grpc-accept-encoding", "identity,deflate,gzip"),
    ]


def test_response_blocks_never_touch_the_peers_dynamic_table() -> None:
    peer = hpack.Decoder()
    for block in (
        RESPONSE_HEADERS,
        trailers(0),
        trailers(13, "x" * 300),
        trailers_only(5, "no", http_status=415),
    ):
        peer.decode(block)
    assert len(peer.header_table.dynamic_entries) == 0


def test_ok_trailers_are_only_the_status() -> None:
    assert decoded(trailers(0)) == [("grpc-status", "0")]


def test_trailers_carry_status_percent_encoded_message_and_extra_metadata() -> None:
    message = "bad input: 100% wrong\r\n\tcafé ☕ \x7f"
    block = decoded(trailers(3, message, (("retry-after", "2"),)))
    assert block[0] == ("grpc-status", "3")
    name, encoded = block[1]
    assert name == "grpc-message"
    assert all(0x20 <= ord(char) <= 0x7E for char in encoded)
    assert "%25" in encoded and "\r" not in encoded  # '%' itself is escaped
    assert unquote(encoded) == message
    assert block[2] == ("retry-after", "2")


def test_a_trailers_only_answer_has_status_content_type_and_the_grpc_status() -> None:
    assert decoded(trailers_only(12, "unknown method /a/b", http_status=405)) == [
        (":status", "405"),
        ("content-type", "application/grpc"),
        ("grpc-status", "12"),
        ("grpc-message", "unknown method /a/b"),
    ]
    assert decoded(trailers_only(8, "full"))[0] == (":status", "200")


@pytest.mark.parametrize("size", [1, 125, 126, 127, 128, 255, 1000, 2000])
def test_string_lengths_past_one_byte_are_encoded_as_hpack_integers(size: int) -> None:
    message = "m" * size
    assert decoded(trailers(2, message))[1] == ("grpc-message", message)


@pytest.mark.parametrize("char", ["x", "é", "☕", "😀", "\n"])
def test_a_long_message_is_cut_on_a_whole_character(char: str) -> None:
    message = char * 20_000
    encoded = dict(decoded(trailers(13, message)))["grpc-message"]
    assert 1000 < len(encoded) <= 2048
    text = unquote(encoded, errors="strict")
    assert message.startswith(text) and text
