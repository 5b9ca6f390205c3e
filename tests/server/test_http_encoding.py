"""Content codings: bodies inflate within the limit and off the loop when large; answers compress."""

from __future__ import annotations

import asyncio
import gzip
import inspect
import tracemalloc
import zlib

import numpy as np
import pytest

from ortserve.errors import InvalidInput, PayloadTooLarge, UnsupportedEncoding
from ortserve.server.http.encoding import (
    COMPRESS_MIN_BYTES,
    INLINE_BUDGET,
    Inflation,
    accepted_coding,
    answer_coding,
    compress_answer,
    inflate_then_route,
)
from ortserve.server.http.messages import HttpRequest, HttpResponse, RouteResult, json_response

MIB = 1024 * 1024
RANDOM = np.random.default_rng(7).bytes(MIB)  # incompressible: the gzip body is as large


def inflate(body: bytes, coding: bytes = b"gzip", limit: int = MIB) -> bytes:
    inflation = Inflation(body, coding, limit)
    assert inflation.run(limit + 1)
    return inflation.body()


@pytest.mark.parametrize(("coding", "compress"), [(b"gzip", gzip.compress), (b"deflate", zlib.compress)])
def test_gzip_and_deflate_bodies_inflate_to_what_was_sent(coding: bytes, compress: object) -> None:
    payload = b'{"inputs": []}' * 1000
    assert inflate(compress(payload), coding) == payload  # type: ignore[operator]


def test_a_large_body_inflates_across_many_input_slices() -> None:
    assert inflate(gzip.compress(RANDOM), limit=2 * MIB) == RANDOM


def test_a_compression_bomb_stops_at_the_limit_without_allocating_what_it_declares() -> None:
    bomb = gzip.compress(bytes(64 * MIB), compresslevel=1)  # about 280 KB on the wire
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLarge, match="inflates past the size limit of 1048576 bytes"):
            inflate(bomb, limit=MIB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * MIB


@pytest.mark.parametrize(
    ("body", "coding", "message"),
    [
        (b"not gzip at all", b"gzip", "not valid gzip"),
        (gzip.compress(b"x" * 1000)[:-12], b"gzip", "cut short"),
        (gzip.compress(b"x") + b"tail", b"gzip", "data follows"),
        (gzip.compress(RANDOM) + b"tail", b"gzip", "data follows"),  # past the first input slice
        (gzip.compress(RANDOM)[:-200_000], b"gzip", "cut short"),
        (b"", b"deflate", "cut short"),
    ],
)
def test_broken_or_unknown_codings_are_invalid_input(body: bytes, coding: bytes, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        inflate(body, coding)


def test_gzip_members_one_after_another_inflate_as_one_body_up_to_a_few() -> None:
    """RFC 1952 2.2 (``cat a.gz b.gz``), also when a member ends at an input slice's end; a
    flood of empty members (each inflating to nothing) is refused at the 65th."""
    assert inflate(gzip.compress(b"hello ") + gzip.compress(b"world")) == b"hello world"
    assert inflate(gzip.compress(RANDOM) + gzip.compress(b"tail"), limit=2 * MIB) == RANDOM + b"tail"
    assert inflate(gzip.compress(b"") * 64) == b""
    with pytest.raises(InvalidInput, match="data follows"):
        inflate(gzip.compress(b"") * 65)


def test_an_unknown_coding_is_unsupported_and_names_the_codings_taken() -> None:
    with pytest.raises(UnsupportedEncoding, match="'br' is not supported") as caught:
        inflate(b"anything", b"br")
    assert caught.value.supported == ("gzip", "deflate", "identity")


def _echo(request: HttpRequest) -> RouteResult:
    return json_response(200, request.body)


def _request(body: bytes) -> HttpRequest:
    return HttpRequest("POST", "/", "", {b"content-encoding": b"gzip"}, body)


def test_small_bodies_inflate_inline_and_large_ones_in_a_worker_thread() -> None:
    small = inflate_then_route(_request(gzip.compress(bytes(INLINE_BUDGET))), b"gzip", 64 * MIB, _echo)
    assert isinstance(small, HttpResponse) and small.chunks == [bytes(INLINE_BUDGET)]
    large = inflate_then_route(_request(gzip.compress(bytes(2 * MIB))), b"gzip", 64 * MIB, _echo)
    assert inspect.iscoroutine(large)
    response = asyncio.run(large)
    assert response.chunks == [bytes(2 * MIB)]


@pytest.mark.parametrize(
    ("accept", "coding"),
    [
        (b"gzip", b"gzip"),
        (b"deflate", b"deflate"),
        (b"deflate, gzip;q=0.5", b"deflate"),
        (b"gzip;q=0, deflate;q=0.1", b"deflate"),
        (b"*", b"gzip"),
        (b"identity", None),
        (b"br", None),
        (b"gzip;q=0", None),
    ],
)
def test_accept_encoding_picks_the_preferred_supported_coding(accept: bytes, coding: bytes | None) -> None:
    assert accepted_coding(accept) == coding


def test_answers_are_compressed_with_their_headers_and_empty_ones_left_alone() -> None:
    answer = compress_answer(json_response(200, b"x" * 5000), b"gzip")
    assert isinstance(answer, HttpResponse)
    assert gzip.decompress(b"".join(answer.chunks)) == b"x" * 5000
    assert (b"content-encoding", b"gzip") in answer.headers
    empty = compress_answer(json_response(200, b""), b"deflate")
    assert isinstance(empty, HttpResponse) and empty.headers == []


@pytest.mark.parametrize(
    ("status", "size"), [(200, COMPRESS_MIN_BYTES - 1), (400, 5000), (503, 5000), (200, 0)]
)
def test_small_answers_and_errors_are_left_as_they_are(status: int, size: int) -> None:
    answer = compress_answer(json_response(status, b"x" * size), b"gzip")
    assert isinstance(answer, HttpResponse)
    assert answer.chunks == [b"x" * size] and answer.headers == []


@pytest.mark.parametrize(
    ("method", "path", "coding"),
    [
        ("POST", "/v2/models/m/infer", b"gzip"),
        ("POST", "/v2/models/m/versions/2/infer", b"gzip"),
        ("GET", "/v2/models/m", None),
        ("GET", "/v2/health/live", None),
        ("POST", "/v2/repository/index", None),
        ("POST", "/v1/chat/completions", None),
    ],
)
def test_only_infer_answers_take_a_coding(method: str, path: str, coding: bytes | None) -> None:
    request = HttpRequest(method, path, "", {b"accept-encoding": b"gzip, deflate, br"}, b"")
    assert answer_coding(request) == coding
    assert answer_coding(HttpRequest(method, path, "", {}, b"")) is None
