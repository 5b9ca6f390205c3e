"""Refusing whole plain POSTs from their first bytes, and running admitted requests after the
loop's reads (issue 30).

The connection is driven by hand here (a transport of the test's own records every write), with
the server's real edge refusal over a data plane whose verdict the test sets: what is refused
from the bytes alone never reaches the parser's request or the handler, the answers read in one
go leave in one write, anything whose framing is in doubt takes the parser's path, and a request
admitted from its head is asked again when its turn comes.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from ortserve.core.dataplane import DataPlane
from ortserve.errors import Overloaded
from ortserve.server.connections import ByteBudget, ConnectionSet
from ortserve.server.http.admission import EarlyRefusal
from ortserve.server.http.connection import ConnectionLimits, HttpConnection
from ortserve.server.http.listener import HttpListener
from ortserve.server.http.messages import HttpRequest, HttpResponse, json_response
from ortserve.server.http.plain_post import plain_post
from ortserve.server.http.run_queue import RunQueue
from ortserve.statistics import ServerStatistics
from ortserve.telemetry import Telemetry

INFER = b"/v2/models/m/infer"


def post(body: bytes = b"{}", target: bytes = INFER, extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s" % (target, extra, len(body), body)


class Plane:
    """The data plane's one question at the edge: refused now, or not."""

    def __init__(self) -> None:
        self.refusing = False
        self.asked = 0
        self.error = Overloaded("the queue is full", retry_after_s=1.0)

    def refusal(
        self, name: str, version: str | None, priority: int, tenant_of: Any = None
    ) -> Overloaded | None:
        self.asked += 1
        return self.error if self.refusing else None


class Wire:
    """A transport that keeps what is written."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.reading = True

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def writelines(self, pieces: list[bytes]) -> None:
        self.writes.append(b"".join(pieces))

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 1) if name == "peername" else default

    def statuses(self) -> list[bytes]:
        return re.findall(rb"HTTP/1\.1 (\d{3})", b"".join(self.writes))


class Served:
    """The edge refusal, a handler that answers 200 with its body length, and connections."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.plane = Plane()
        self.telemetry = Telemetry(ServerStatistics())
        self.edge = EarlyRefusal(cast(DataPlane, self.plane), self.telemetry)
        self.handled: list[bytes] = []
        self.on_handle: list[Any] = []
        self.runs = RunQueue(loop)
        self.budget = ByteBudget(1 << 30)

    def handler(self, request: HttpRequest) -> HttpResponse:
        self.handled.append(request.body)
        for hook in self.on_handle:
            hook()
        return json_response(200, b'"%d"' % len(request.body))

    def connect(self) -> tuple[HttpConnection, Wire]:
        state: ConnectionSet[HttpConnection] = ConnectionSet()
        connection = HttpConnection(
            self.handler,
            ConnectionLimits(),
            state,
            self.loop,
            self.budget,
            self.edge,
            self.edge.refuse_target,
            self.runs,
        )
        wire = Wire()
        connection.connection_made(cast(asyncio.Transport, wire))
        return connection, wire


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    yield Served(asyncio.get_running_loop())


async def test_whole_refused_posts_read_together_are_answered_in_one_write_without_the_handler(
    served: Served,
) -> None:
    served.plane.refusing = True
    connection, wire = served.connect()
    connection.data_received(post(b"a") + post(b"bb") + post(b"ccc"))
    assert len(wire.writes) == 1  # one write for the three answers
    assert wire.statuses() == [b"429", b"429", b"429"]
    assert wire.writes[0].count(b"retry-after: 1\r\n") == 3
    assert b"connection: close" not in wire.writes[0]
    assert served.handled == [] and served.plane.asked == 3
    # The connection goes on: the verdict changes and the next request is served.
    served.plane.refusing = False
    connection.data_received(post(b"dddd"))
    await asyncio.sleep(0)  # its turn, after this iteration's reads
    assert wire.statuses()[-1] == b"200" and served.handled == [b"dddd"]
    assert served.budget.held == 0


async def test_a_refusal_read_behind_a_request_waiting_its_turn_is_answered_after_it(served: Served) -> None:
    connection, wire = served.connect()
    connection.data_received(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
    served.plane.refusing = True
    connection.data_received(post(b"second"))  # read while the first waits for its turn
    assert wire.writes == []  # nothing jumps the request before it
    await asyncio.sleep(0)
    assert wire.statuses() == [b"200", b"429"]
    assert served.handled == [b""]


async def test_a_request_admitted_from_its_head_is_refused_at_its_turn_if_the_queue_filled(
    served: Served,
) -> None:
    first, first_wire = served.connect()
    second, second_wire = served.connect()
    served.on_handle.append(lambda: setattr(served.plane, "refusing", True))
    first.data_received(post(b"one"))  # both heads read in the same iteration, both admitted
    second.data_received(post(b"two"))
    assert served.budget.held == 6
    await asyncio.sleep(0)
    assert first_wire.statuses() == [b"200"]
    reply = b"".join(second_wire.writes)
    assert reply.startswith(b"HTTP/1.1 429") and b"retry-after: 1\r\n" in reply
    assert served.handled == [b"one"]  # the second body was never decoded
    assert served.budget.held == 0  # and its bytes were given back


async def test_a_request_refused_at_its_turn_echoes_its_request_id_as_at_its_head(served: Served) -> None:
    first, _ = served.connect()
    second, second_wire = served.connect()
    served.on_handle.append(lambda: setattr(served.plane, "refusing", True))
    first.data_received(post(b"one"))
    second.data_received(post(b"two", extra=b"X-Request-ID: turn-2\r\n"))  # the parser's path
    await asyncio.sleep(0)
    reply = b"".join(second_wire.writes)
    assert reply.startswith(b"HTTP/1.1 429") and b"x-request-id: turn-2\r\n" in reply.lower()


@pytest.mark.parametrize(
    ("extra", "closes"),
    [
        (b"Connection: close\r\n", True),
        (b"X-Request-ID: abc\r\n", False),
        (b"Expect: 100-continue\r\n", False),
    ],
)
async def test_a_post_whose_head_needs_reading_is_refused_by_the_headers_path(
    served: Served, extra: bytes, closes: bool
) -> None:
    served.plane.refusing = True
    connection, wire = served.connect()
    connection.data_received(post(b"xy", extra=extra))
    await asyncio.sleep(0)
    if extra.startswith(b"Expect"):  # a client waiting for 100 Continue is not refused unread
        assert wire.statuses() == [b"100", b"200"]
        return
    reply = b"".join(wire.writes)
    assert wire.statuses() == [b"429"] and b"retry-after: 1\r\n" in reply
    assert (b"connection: close" in reply) == closes and wire.closed == closes
    if extra.startswith(b"X-Request-ID"):
        assert b"x-request-id: abc\r\n" in reply


async def test_a_head_split_over_reads_is_refused_by_the_parser(served: Served) -> None:
    served.plane.refusing = True
    connection, wire = served.connect()
    whole = post(b"abcdef")
    connection.data_received(whole[:20])
    connection.data_received(whole[20:])
    assert wire.statuses() == [b"429"] and served.handled == []


@pytest.mark.parametrize(
    "head",
    [
        b"POST /x HTTP/1.0\r\nContent-Length: 1",  # not HTTP/1.1
        b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked",  # both framings
        b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1",  # two lengths
        b"POST /x HTTP/1.1\r\nHost: a\nContent-Length: 1",  # a bare LF
        b"POST /x HTTP/1.1\r\nHost: a\r\n b\r\nContent-Length: 1",  # a folded line
        b"POST /x HTTP/1.1\r\nContent-Length : 1",  # a space before the colon
        b"POST /x HTTP/1.1\r\nContent-Length: 1x",  # not digits
        b"POST /x HTTP/1.1\r\nContent-Length: -1",
        b"POST /x HTTP/1.1\r\nHost: a",  # no length
        b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nConnection: upgrade",
        b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nUpgrade: h2c",
        b"POST /x y HTTP/1.1\r\nContent-Length: 1",  # a space in the target
    ],
)
def test_a_head_in_any_doubt_is_left_to_the_parser(head: bytes) -> None:
    assert plain_post(head, ConnectionLimits()) is None


def test_a_plain_head_gives_its_target_and_length() -> None:
    head = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: a\r\nconnection: Keep-Alive\r\ncontent-length:  12 "
    assert plain_post(head, ConnectionLimits()) == (b"/v2/models/m/infer", 12)
    assert plain_post(b"POST /x HTTP/1.1\r\nContent-Length: 12", ConnectionLimits(max_body_bytes=11)) is None


class Listened:
    def __init__(self, plane: Plane, port: int) -> None:
        self.plane = plane
        self.port = port


@pytest.fixture
async def listened() -> AsyncIterator[Listened]:
    plane = Plane()
    edge = EarlyRefusal(cast(DataPlane, plane), Telemetry(ServerStatistics()))

    def handler(request: HttpRequest) -> HttpResponse:
        return json_response(200, b'"%d"' % len(request.body))

    listener = HttpListener(handler, ConnectionLimits(), admission=edge)
    port = await listener.start("127.0.0.1", 0)
    yield Listened(plane, port)
    listener.stop_accepting()
    await listener.wait_closed(1.0)


async def test_over_a_socket_pipelined_refusals_and_answers_come_back_in_order(listened: Listened) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", listened.port)
    listened.plane.refusing = True
    writer.write(post(b"1") + post(b"22"))
    await writer.drain()
    replies = b""
    async with asyncio.timeout(5):
        while replies.count(b"HTTP/1.1 ") < 2:
            replies += await reader.read(65536)
    listened.plane.refusing = False
    writer.write(post(b"333") + post(b"4444", target=b"/v2/models/m/versions/2/infer"))
    async with asyncio.timeout(5):
        while replies.count(b"HTTP/1.1 ") < 4:
            replies += await reader.read(65536)
    assert re.findall(rb"HTTP/1\.1 (\d{3})", replies) == [b"429", b"429", b"200", b"200"]
    assert replies.count(b"retry-after: 1\r\n") == 2
    assert replies.index(b'"3"') < replies.index(b'"4"')  # the answers in request order
    writer.close()
