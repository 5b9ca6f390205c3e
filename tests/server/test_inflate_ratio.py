"""A compressed request stops inflating at a ratio to its compressed size, not only at the size
limit: a 64 KB gzip bomb costs 16 MiB of inflation, not the whole 64 MiB body limit."""

from __future__ import annotations

import gzip

import pytest

from ortserve.errors import PayloadTooLarge
from ortserve.server.grpc.errors import GrpcAbort, StatusCode
from ortserve.server.grpc.inflate import InflateJob
from ortserve.server.http.encoding import Inflation
from ortserve.server.inflate_ratio import RATIO_FLOOR

MIB = 1 << 20
BOMB = gzip.compress(bytes(64 * MIB), compresslevel=9)  # about 64 KB on the wire


def test_an_http_gzip_bomb_stops_at_the_ratio_not_at_the_body_limit() -> None:
    assert len(BOMB) < 70_000
    inflation = Inflation(BOMB, b"gzip", 64 * MIB)
    with pytest.raises(PayloadTooLarge, match="inflates more than 200 times its compressed size"):
        inflation.run(64 * MIB + 1)
    assert inflation._size <= RATIO_FLOOR + 64 * 1024  # the work done, a quarter of the limit


def test_a_grpc_gzip_bomb_stops_at_the_ratio() -> None:
    job = InflateJob(BOMB, 31, 64 * MIB)
    while not job.done:
        job.step(1 * MIB)
    with pytest.raises(GrpcAbort) as caught:
        job.take()
    assert caught.value.code is StatusCode.RESOURCE_EXHAUSTED
    assert "more than 200 times its compressed size" in caught.value.message


def test_bodies_of_one_repeated_value_still_inflate_below_the_floor() -> None:
    """A JSON tensor of zeros compresses about 680 times: legitimate, and within the floor."""
    body = b'{"inputs":[{"name":"x","data":[' + b"0.0," * (3 * MIB) + b"0.0]}]}"
    inflation = Inflation(gzip.compress(body), b"gzip", 64 * MIB)
    assert inflation.run(64 * MIB + 1) and inflation.body() == body
