"""The lockout of issue 27: connections that open a request and never finish it, at the
connection cap, on a real HTTP and a real gRPC listener sharing one cap; and the deadline for a
request to arrive whole, on both transports."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import h2.config
import h2.connection
import h2.events

from ortserve.core.dataplane import DataPlane
from ortserve.core.model import ServedVersion
from ortserve.core.types import ServerMetadata
from ortserve.errors import ModelNotFound
from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.protocol.tensors import TensorLimits
from ortserve.server.connections import ConnectionLimit
from ortserve.server.grpc.listener import GrpcListener, GrpcOptions
from ortserve.server.http.connection import ConnectionLimits
from ortserve.server.http.listener import HttpListener
from ortserve.server.http.messages import HttpRequest, HttpResponse, json_response
from ortserve.settings import ServerSettings
from waiting import until

CAP = 50
INFER = "/inference.GRPCInferenceService/ModelInfer"


class NoModels:
    """A repository with no model (the listeners are what is under test)."""

    all_ready = False

    def resolve(self, name: str, version: str | None) -> ServedVersion:
        raise ModelNotFound(f"unknown model {name!r}")

    def served_versions(self, name: str) -> tuple[str, ...]:
        raise ModelNotFound(f"unknown model {name!r}")


def answer(request: HttpRequest) -> HttpResponse:
    return json_response(200, b'{"path":"%s","size":%d}' % (request.path.encode(), len(request.body)))


def grpc_options(**fields: object) -> GrpcOptions:
    return GrpcOptions.from_settings(ServerSettings(Path("."), **fields))  # type: ignore[arg-type]


@dataclass
class Site:
    """Both listeners under one cap, and the raw connections a test opened (closed at the end)."""

    cap: ConnectionLimit
    http_port: int
    grpc_port: int
    opened: list[asyncio.StreamWriter] = field(default_factory=list)

    async def connect(self, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        self.opened.append(writer)
        return reader, writer


@contextlib.asynccontextmanager
async def serving(limits: ConnectionLimits | None = None, **grpc_fields: object) -> AsyncIterator[Site]:
    cap = ConnectionLimit(CAP)
    http = HttpListener(answer, limits or ConnectionLimits(), cap)
    dataplane = DataPlane(NoModels(), ServerMetadata("ortserve", "test", ()))
    grpc_listener = GrpcListener(dataplane, TensorLimits(), grpc_options(**grpc_fields), connection_limit=cap)
    site = Site(cap, await http.start("127.0.0.1", 0), await grpc_listener.start("127.0.0.1", 0))
    try:
        yield site
    finally:
        for writer in site.opened:
            writer.transport.abort()
        http.stop_accepting()
        grpc_listener.stop_accepting(0.5)
        await http.wait_closed(0.5)
        await grpc_listener.wait_closed()


def opened_call(path: str = INFER) -> tuple[h2.connection.H2Connection, bytes]:
    """A gRPC client's preface and a call it opens and never ends (HEADERS, no END_STREAM)."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    fields = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x")]
    client.send_headers(1, [*fields, ("content-type", "application/grpc"), ("te", "trailers")])
    return client, client.data_to_send()


def trickled_head(size: int = 1_000_000) -> bytes:
    return b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{" % size


async def stall_grpc_call(site: Site) -> None:
    """Open a connection, open a ModelInfer call on it and never end it; returns once the
    server has read the call (it answered the PING sent behind it)."""
    reader, writer = await site.connect(site.grpc_port)
    client, opening = opened_call()
    client.ping(b"stalled!")
    writer.write(opening + client.data_to_send())
    while True:
        data = await asyncio.wait_for(reader.read(65536), 5)
        assert data, "closed by the server"
        if any(isinstance(e, h2.events.PingAckReceived) for e in client.receive_data(data)):
            return


async def stall_http_body(site: Site) -> None:
    """Open a connection and send a request head and one byte of its body; returns once the
    server has read the head (it asked for the body)."""
    reader, writer = await site.connect(site.http_port)
    head = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n"
    writer.write(head + b"Expect: 100-continue\r\n\r\n")
    assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"HTTP/1.1 100 ")
    writer.write(b"{")


async def http_get(port: int, path: bytes) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path)
        status = await asyncio.wait_for(reader.readline(), 5)
        return int(status.split()[1])
    finally:
        writer.close()


async def grpc_live(port: int) -> bool:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        live = channel.unary_unary(
            "/inference.GRPCInferenceService/ServerLive",
            request_serializer=pb.ServerLiveRequest.SerializeToString,
            response_deserializer=pb.ServerLiveResponse.FromString,
        )
        return bool((await live(pb.ServerLiveRequest(), timeout=5)).live)


# -- the lockout ---------------------------------------------------------------------------


async def test_requests_that_never_finish_at_the_cap_do_not_lock_new_clients_out() -> None:
    """The cap filled with gRPC calls opened and left without END_STREAM and HTTP bodies
    stalled after a byte: every new client, HTTP or gRPC, probe or not, is answered (each
    takes the place of a stalled one). They used to get 503 and UNAVAILABLE until keepalive."""
    async with serving() as site:
        for i in range(CAP):
            await (stall_grpc_call(site) if i % 2 else stall_http_body(site))
        assert site.cap.open == CAP
        for _ in range(3):
            assert await http_get(site.http_port, b"/v2/health/ready") == 200
            assert await http_get(site.http_port, b"/v2/models/m") == 200
            assert await grpc_live(site.grpc_port)
        assert site.cap.refused == 0 and site.cap.evicted >= 1


async def test_connections_arriving_in_a_burst_at_the_cap_take_stalled_places() -> None:
    async with serving() as site:
        for _ in range(CAP):
            await stall_grpc_call(site)
        results = await asyncio.gather(*(http_get(site.http_port, b"/v2/health/live") for _ in range(20)))
        assert results == [200] * 20


# -- the arrival deadline ------------------------------------------------------------------


async def test_an_http_body_trickled_above_the_minimum_rate_gets_408_at_the_request_timeout() -> None:
    limits = ConnectionLimits(header_timeout_s=0.3, min_body_rate=10.0, request_timeout_s=0.8)
    async with serving(limits) as site:
        reader, writer = await site.connect(site.http_port)
        writer.write(trickled_head(10_000))

        async def trickle() -> None:
            while True:  # 20 B/s, twice the minimum rate: only the absolute cap ends it
                await asyncio.sleep(0.05)  # real pacing: the rate the server measures is the case
                writer.write(b"x")

        trickler = asyncio.create_task(trickle())
        try:
            status = await asyncio.wait_for(reader.readline(), 5)
        finally:
            trickler.cancel()
        assert status.startswith(b"HTTP/1.1 408 ")
        assert await asyncio.wait_for(reader.read(), 5) is not None  # then closed


async def test_a_grpc_call_left_without_its_request_ends_deadline_exceeded_and_frees_its_place() -> None:
    async with serving(header_timeout_s=0.3) as site:
        reader, writer = await site.connect(site.grpc_port)
        client, preface = opened_call()
        writer.write(preface)
        await until(lambda: site.cap.evictable == 1)
        status: dict[bytes, bytes] = {}
        reset = False
        while not reset:
            data = await asyncio.wait_for(reader.read(65536), 5)
            assert data, "the server closed before answering"
            for event in client.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                    status.update(dict(event.headers))
                reset = reset or isinstance(event, h2.events.StreamReset)
        assert status[b"grpc-status"] == b"4"  # DEADLINE_EXCEEDED
        assert b"not received in time" in status[b"grpc-message"]
        await until(lambda: site.cap.open == 1 and site.cap.evictable == 1)  # quiet again, evictable


async def _call_ended(
    reader: asyncio.StreamReader, client: h2.connection.H2Connection, stream_id: int
) -> bytes:
    """Read until ``stream_id`` is reset; its grpc-status."""
    status = b""
    while True:
        data = await asyncio.wait_for(reader.read(65536), 10)
        assert data, "the server closed before answering"
        for event in client.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                status = dict(event.headers).get(b"grpc-status", status)
            if isinstance(event, h2.events.StreamReset) and event.stream_id == stream_id:
                return status


async def test_a_peer_whose_call_came_too_late_is_not_read_for_three_graces() -> None:
    """The sustained attack re-opened a stalled call as soon as the server ended one: 10,000
    connections cost a call each per 10 s grace, and that churn kept the server's loop busy
    on a shared CPU. The next call on such a connection is read only after three graces (it
    is ended at its own deadline after that), and the connection stays evictable meanwhile."""
    async with serving(header_timeout_s=0.3) as site:
        reader, writer = await site.connect(site.grpc_port)
        client, preface = opened_call()
        writer.write(preface)
        assert await _call_ended(reader, client, 1) == b"4"  # DEADLINE_EXCEEDED after 0.3 s
        loop = asyncio.get_running_loop()
        reopened = loop.time()
        fields = [(":method", "POST"), (":scheme", "http"), (":path", INFER), (":authority", "x")]
        client.send_headers(3, [*fields, ("content-type", "application/grpc"), ("te", "trailers")])
        writer.write(client.data_to_send())
        await until(lambda: site.cap.open == 1 and site.cap.evictable == 1)
        assert await _call_ended(reader, client, 3) == b"4"
        assert loop.time() - reopened >= 3 * 0.3 + 0.3 - 0.05  # rest, then its own grace


# -- one peer's share ----------------------------------------------------------------------


async def test_a_peer_past_its_share_is_refused_on_both_transports_and_others_are_not_counted() -> None:
    cap = ConnectionLimit(CAP, per_peer=2)
    http = HttpListener(answer, ConnectionLimits(), cap)
    dataplane = DataPlane(NoModels(), ServerMetadata("ortserve", "test", ()))
    grpc_listener = GrpcListener(dataplane, TensorLimits(), grpc_options(), connection_limit=cap)
    site = Site(cap, await http.start("127.0.0.1", 0), await grpc_listener.start("127.0.0.1", 0))
    try:
        await stall_http_body(site)
        await stall_grpc_call(site)
        reader, _ = await site.connect(site.http_port)
        reply = await asyncio.wait_for(reader.read(), 5)
        assert reply.startswith(b"HTTP/1.1 503 ") and b"too many connections from this address" in reply
        reader, _ = await site.connect(site.grpc_port)
        refused = await asyncio.wait_for(reader.read(), 5)
        assert b"too many connections from this address" in refused  # GOAWAY's debug data
        first = site.opened.pop(0)
        first.transport.abort()  # one of its connections closes: its share is back
        first.close()
        await until(lambda: cap.open == 1)
        assert await http_get(site.http_port, b"/v2/health/live") == 200
    finally:
        for writer in site.opened:
            writer.transport.abort()
        http.stop_accepting()
        grpc_listener.stop_accepting(0.5)
        await http.wait_closed(0.5)
        await grpc_listener.wait_closed()
