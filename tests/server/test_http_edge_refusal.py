"""The HTTP connection's refusal from the headers: when it is written, and what follows it.

A real listener on a socket, with a handler and an admission hook of the test's own, so each
case can hold an answer back or refuse exactly the request it means to.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import pytest

from ortserve.server.http.connection import ConnectionLimits
from ortserve.server.http.listener import HttpListener
from ortserve.server.http.messages import Deferred, HttpRequest, HttpResponse, json_response
from ortserve.server.http.wire import CannedResponse, canned
from waiting import until

REFUSED = canned(json_response(429, b'{"error":"busy"}', [(b"retry-after", b"1")]))


class Gate:
    """Refuses POSTs to /refuse; answers everything else, holding /slow until released."""

    def __init__(self) -> None:
        self.handled: list[str] = []
        self.held: asyncio.Future[None] | None = None
        self.refusing = asyncio.Event()  # set once the server has read a head it refuses

    def admission(self, method: bytes, url: bytes, headers: dict[bytes, bytes]) -> CannedResponse | None:
        if url == b"/refuse" and method == b"POST":
            self.refusing.set()
            return REFUSED
        return None

    def handler(self, request: HttpRequest) -> HttpResponse | Deferred[HttpResponse]:
        self.handled.append(request.path)
        if request.path == "/slow":
            self.held = asyncio.get_running_loop().create_future()
            return Deferred(self.held, lambda _: json_response(200, b'"slow"'))
        return json_response(200, b'"%d"' % len(request.body))


@pytest.fixture
async def served() -> AsyncIterator[tuple[Gate, int]]:
    gate = Gate()
    listener = HttpListener(gate.handler, ConnectionLimits(header_timeout_s=0.5), admission=gate.admission)
    port = await listener.start("127.0.0.1", 0)
    yield gate, port
    listener.stop_accepting()
    await listener.wait_closed(1.0)


async def read_until(reader: asyncio.StreamReader, responses: int, timeout_s: float = 5.0) -> bytes:
    data = b""
    async with asyncio.timeout(timeout_s):
        while data.count(b"HTTP/1.1 ") < responses:
            chunk = await reader.read(65536)
            if not chunk:
                break
            data += chunk
    return data


async def test_a_refusal_is_written_before_its_body_arrives(served: tuple[Gate, int]) -> None:
    gate, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
    head = await read_until(reader, 1)
    assert head.startswith(b"HTTP/1.1 429") and head.endswith(b'{"error":"busy"}')
    assert b"retry-after: 1" in head and b"connection: close" not in head
    # The body still comes, and is dropped; the connection goes on with the next request.
    writer.write(b"0123456789POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
    rest = await read_until(reader, 1)
    assert rest.startswith(b"HTTP/1.1 200") and rest.endswith(b'"3"')
    assert gate.handled == ["/echo"]  # the refused request never reached the handler
    writer.close()


async def test_a_refusal_waits_for_the_answer_owed_before_it(served: tuple[Gate, int]) -> None:
    gate, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"
        b"POST /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nzz"
        b"GET /after HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    await asyncio.wait_for(gate.refusing.wait(), 5)  # its refusal is decided: it could be written now
    held = await until(lambda: gate.held, 5, "the slow request handled")
    assert not held.done()
    assert not await _has_data(reader)  # the refusal does not jump the queue
    held.set_result(None)
    replies = await read_until(reader, 3)
    statuses = re.findall(rb"HTTP/1\.1 (\d{3})", replies)
    assert statuses == [b"200", b"429", b"200"]  # in request order
    assert replies.index(b'"slow"') < replies.index(b"busy")
    writer.close()


async def test_a_closing_request_is_refused_after_its_body_then_closed(served: tuple[Gate, int]) -> None:
    gate, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /refuse HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 4\r\n\r\n")
    await asyncio.wait_for(gate.refusing.wait(), 5)  # its refusal is decided: it could be written now
    assert not await _has_data(reader)  # nothing written while the client is still sending
    writer.write(b"abcd")
    reply = await read_until(reader, 1)
    assert reply.startswith(b"HTTP/1.1 429") and b"connection: close" in reply
    assert await reader.read() == b""  # then closed
    writer.close()


async def test_a_body_that_stalls_after_its_refusal_is_closed_with_no_second_answer(
    served: tuple[Gate, int],
) -> None:
    _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly-part")
    everything = b""
    async with asyncio.timeout(5.0):  # the header timeout is 0.5 s; the body never completes
        while chunk := await reader.read(65536):
            everything += chunk
    assert everything.count(b"HTTP/1.1 ") == 1 and everything.startswith(b"HTTP/1.1 429")
    writer.close()


async def _has_data(reader: asyncio.StreamReader) -> bool:
    try:
        await asyncio.wait_for(reader.read(1), 0.1)
    except TimeoutError:
        return False
    return True
