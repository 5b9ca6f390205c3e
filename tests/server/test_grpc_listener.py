"""The gRPC listener in process: options from settings, a taken port refused, health that follows readiness."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import h2.config
import h2.connection
import pytest
from google.protobuf import empty_pb2
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ortserve.core.dataplane import DataPlane
from ortserve.core.model import ServedVersion
from ortserve.core.types import ServerMetadata
from ortserve.errors import ModelNotFound
from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.protocol.tensors import TensorLimits
from ortserve.server.connections import ConnectionLimit
from ortserve.server.grpc import listener as grpc_listener_module
from ortserve.server.grpc.call import GrpcCall
from ortserve.server.grpc.listener import GrpcListener, GrpcOptions
from ortserve.server.grpc.rpc import Rpc
from ortserve.settings import ServerSettings

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass
class FakeResolver:
    """Readiness a test can flip; knows no models."""

    all_ready: bool = False

    def resolve(self, name: str, version: str | None) -> ServedVersion:
        raise ModelNotFound(f"unknown model {name!r}")

    def served_versions(self, name: str) -> tuple[str, ...]:
        raise ModelNotFound(f"unknown model {name!r}")


def options(**fields: object) -> GrpcOptions:
    return GrpcOptions.from_settings(ServerSettings(Path("."), **fields))  # type: ignore[arg-type]


def test_message_size_defaults_to_the_http_body_limit() -> None:
    assert options(max_body_bytes=123_456).max_message_bytes == 123_456
    assert options(max_body_bytes=123_456, grpc_max_message_bytes=99).max_message_bytes == 99


def test_options_carry_keepalive_streams_and_sizes() -> None:
    grpc_options = options(
        grpc_max_message_bytes=5000,
        grpc_keepalive_time_s=30.0,
        grpc_keepalive_timeout_s=2.5,
        grpc_max_concurrent_streams=7,
    )
    assert grpc_options.max_message_bytes == 5000
    assert (grpc_options.keepalive_time_s, grpc_options.keepalive_timeout_s) == (30.0, 2.5)
    assert grpc_options.max_concurrent_streams == 7


def test_the_http2_preface_deadline_is_the_header_timeout() -> None:
    assert options(header_timeout_s=2.5).engine().preface_timeout_s == 2.5


@pytest.fixture
async def listener() -> AsyncIterator[tuple[GrpcListener, FakeResolver, int]]:
    resolver = FakeResolver()
    dataplane = DataPlane(resolver, ServerMetadata("ortserve", "test", ()))
    grpc_listener = GrpcListener(dataplane, TensorLimits(), options())
    port = await grpc_listener.start("127.0.0.1", 0)
    yield grpc_listener, resolver, port
    grpc_listener.stop_accepting(0.5)
    await grpc_listener.wait_closed()


async def test_a_port_in_use_is_refused(listener: tuple[GrpcListener, FakeResolver, int]) -> None:
    _, _, port = listener
    other = GrpcListener(DataPlane(FakeResolver(), ServerMetadata("o", "t", ())), TensorLimits(), options())
    with pytest.raises(OSError, match="cannot listen"):
        await other.start("127.0.0.1", port)


async def test_a_port_held_by_a_plain_socket_is_refused() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        taken = sock.getsockname()[1]
        other = GrpcListener(
            DataPlane(FakeResolver(), ServerMetadata("o", "t", ())), TensorLimits(), options()
        )
        with pytest.raises(OSError, match="cannot listen"):
            await other.start("127.0.0.1", taken)


async def test_health_watch_follows_readiness_and_ends_on_drain(
    listener: tuple[GrpcListener, FakeResolver, int],
) -> None:
    grpc_listener, resolver, port = listener
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        assert (await health.Check(health_pb2.HealthCheckRequest(), timeout=5)).status == NOT_SERVING
        watch = health.Watch(health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService"))
        assert (await watch.read()).status == NOT_SERVING
        resolver.all_ready = True
        grpc_listener.readiness_changed()
        assert (await watch.read()).status == SERVING
        assert (await health.Check(health_pb2.HealthCheckRequest(), timeout=5)).status == SERVING
        resolver.all_ready = False  # as when draining starts
        grpc_listener.stop_accepting(5.0)
        assert (await watch.read()).status == NOT_SERVING
        assert await watch.read() is grpc.aio.EOF
        assert await watch.code() == grpc.StatusCode.OK


def open_call() -> bytes:
    """A client's preface and a call it opens and never ends (HEADERS without END_STREAM)."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    path = "/inference.GRPCInferenceService/ModelInfer"
    fields = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x")]
    client.send_headers(1, [*fields, ("content-type", "application/grpc"), ("te", "trailers")])
    return client.data_to_send()


async def test_a_connection_with_no_call_open_makes_room_at_the_cap() -> None:
    """A client that sent the preface and then nothing used to hold its place until keepalive
    (two hours): at the cap it now goes, with GOAWAY, for a client that wants a call."""
    dataplane = DataPlane(FakeResolver(), ServerMetadata("ortserve", "test", ()))
    grpc_listener = GrpcListener(dataplane, TensorLimits(), options(), connection_limit=ConnectionLimit(1))
    port = await grpc_listener.start("127.0.0.1", 0)
    try:
        quiet = await asyncio.open_connection("127.0.0.1", port)
        quiet[1].write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        await quiet[0].readexactly(9)  # the server's SETTINGS: it has spoken and is served
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            # Answered (the fake models are not all ready), not refused for the cap.
            answer = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
            assert answer.status in (SERVING, NOT_SERVING)
        rest = await asyncio.wait_for(quiet[0].read(), 5)  # the quiet one was closed
        assert b"closed to make room for a new connection" in rest
        quiet[1].close()
    finally:
        grpc_listener.stop_accepting(0.5)
        await grpc_listener.wait_closed()


def held_call(path: str) -> bytes:
    """A client's preface and one whole unary call (an empty message, END_STREAM)."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    fields = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x")]
    client.send_headers(1, [*fields, ("content-type", "application/grpc"), ("te", "trailers")])
    client.send_data(1, b"\x00\x00\x00\x00\x00", end_stream=True)
    return client.data_to_send()


@contextlib.asynccontextmanager
async def serving_one_held_call() -> AsyncIterator[int]:
    """A listener capped at one connection, taken by a call whose whole request is being
    answered (never closed for a new connection); yields the port."""
    release = asyncio.Event()

    async def hold(request: Message, call: GrpcCall) -> Message:
        await release.wait()
        return empty_pb2.Empty()

    dataplane = DataPlane(FakeResolver(), ServerMetadata("ortserve", "test", ()))
    grpc_listener = GrpcListener(dataplane, TensorLimits(), options(), connection_limit=ConnectionLimit(1))
    grpc_listener._routes["/test.Hold/Call"] = Rpc(empty_pb2.Empty, unary=hold)
    port = await grpc_listener.start("127.0.0.1", 0)
    try:
        occupant = await asyncio.open_connection("127.0.0.1", port)
        occupant[1].write(held_call("/test.Hold/Call"))
        await occupant[0].readexactly(9)  # the server's SETTINGS: it is being served
        yield port
        occupant[1].close()
    finally:
        release.set()
        grpc_listener.stop_accepting(0.5)
        await grpc_listener.wait_closed()


async def test_over_the_cap_probes_are_answered_and_other_calls_fail_unavailable() -> None:
    async with serving_one_held_call() as port, grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        answer = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert answer.status == NOT_SERVING  # answered: the fake models are not all ready
        live = channel.unary_unary(
            "/inference.GRPCInferenceService/ServerLive",
            request_serializer=pb.ServerLiveRequest.SerializeToString,
            response_deserializer=pb.ServerLiveResponse.FromString,
        )
        assert (await live(pb.ServerLiveRequest(), timeout=5)).live
        metadata = channel.unary_unary(
            "/inference.GRPCInferenceService/ServerMetadata",
            request_serializer=pb.ServerMetadataRequest.SerializeToString,
            response_deserializer=pb.ServerMetadataResponse.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await metadata(pb.ServerMetadataRequest(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert refused.value.details() == "too many connections"


async def test_with_no_refusing_place_left_a_connection_over_the_cap_gets_a_bare_goaway(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(grpc_listener_module, "_MAX_REFUSING", 0)
    async with serving_one_held_call() as port:
        bare = await asyncio.open_connection("127.0.0.1", port)
        answer = await asyncio.wait_for(bare[0].read(), 5)
        assert answer[3] == 4 and answer[9 + 3] == 7  # SETTINGS, then GOAWAY, then closed
        assert int.from_bytes(answer[9 + 13 : 9 + 17], "big") == 7  # REFUSED_STREAM
        bare[1].close()
