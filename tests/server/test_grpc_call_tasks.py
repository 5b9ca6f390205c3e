"""A gRPC call's handler task ends in one place (``GrpcCall._on_task``), unary or streaming.

A handler's exception becomes the call's status, a unary handler's result its answer, a
streaming one's return the OK end, and a task the server cancels while the call still runs
(shutdown) ends the call UNAVAILABLE: the client is told, unary or streaming alike. Driven with
a recording owner, so what the call sends is read as header blocks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import hpack
import pytest
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2

from ortserve.errors import ModelNotFound
from ortserve.server.grpc.call import GrpcCall
from ortserve.server.grpc.errors import StatusCode
from ortserve.server.grpc.headers import RequestHead
from ortserve.server.grpc.inflate import Inflater
from ortserve.server.grpc.messages import framed
from ortserve.server.grpc.rpc import Rpc

REQUEST = health_pb2.HealthCheckRequest(service="x")


class Owner:
    """Records what the call sends, as (kind, decoded header block or message bytes)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []

    def send_answer(self, call: GrpcCall, payload: bytes) -> None:
        self.sent.append(("answer", payload))

    def send_headers(self, call: GrpcCall, block: bytes) -> None:
        self.sent.append(("headers", dict(hpack.Decoder().decode(block))))

    def send_message(self, call: GrpcCall, payload: bytes) -> None:
        self.sent.append(("message", payload))

    def send_trailers(self, call: GrpcCall, block: bytes) -> None:
        self.sent.append(("trailers", dict(hpack.Decoder().decode(block))))

    def drained(self, call: GrpcCall) -> None:
        return None

    def status(self) -> tuple[int, str]:
        """The call's grpc-status and grpc-message (it ended with trailers)."""
        kind, block = self.sent[-1]
        assert kind == "trailers" and isinstance(block, dict)
        return int(block["grpc-status"]), str(block.get("grpc-message", ""))


def call_of(rpc: Rpc, owner: Owner) -> GrpcCall:
    head = RequestHead(b"POST", "/grpc.health.v1.Health/Check", b"application/grpc", None, b"identity", ())
    loop = asyncio.get_running_loop()
    return GrpcCall(owner, 1, head, rpc, loop, 1 << 20, Inflater(loop))


async def settle_tasks() -> None:
    for _ in range(5):  # the task's step, then its done callback
        await asyncio.sleep(0)


async def run_unary(handler: Callable[[Message, GrpcCall], object]) -> tuple[Owner, GrpcCall]:
    owner = Owner()
    call = call_of(Rpc(health_pb2.HealthCheckRequest, unary=handler), owner)
    call.start()
    call.receive(memoryview(framed(REQUEST.SerializeToString())), end_stream=True)
    return owner, call


async def run_streaming(handler: Callable[[GrpcCall], Coroutine[Any, Any, None]]) -> tuple[Owner, GrpcCall]:
    owner = Owner()
    call = call_of(Rpc(health_pb2.HealthCheckRequest, streaming=handler), owner)
    call.start()
    return owner, call


async def test_a_unary_coroutine_answers_with_its_result() -> None:
    async def check(request: Message, call: GrpcCall) -> Message:
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    owner, call = await run_unary(check)
    await settle_tasks()
    [(kind, payload)] = owner.sent
    assert kind == "answer" and isinstance(payload, bytes)
    assert health_pb2.HealthCheckResponse.FromString(payload[5:]).status == 1
    assert call.ended


@pytest.mark.parametrize("streaming", [False, True])
async def test_what_a_handler_task_raises_is_the_calls_status(streaming: bool) -> None:
    async def unary(request: Message, call: GrpcCall) -> Message:
        await asyncio.sleep(0)
        raise ModelNotFound("unknown model 'x'")

    async def stream(call: GrpcCall) -> None:
        call.write(health_pb2.HealthCheckResponse())
        await asyncio.sleep(0)
        raise ModelNotFound("unknown model 'x'")

    owner, call = await (run_streaming(stream) if streaming else run_unary(unary))
    await settle_tasks()
    assert owner.status() == (StatusCode.NOT_FOUND, "unknown model 'x'")
    assert call.ended
    # A stream's status follows the messages it sent (its headers went first).
    assert [kind for kind, _ in owner.sent] == (
        ["headers", "message", "trailers"] if streaming else ["trailers"]
    )


@pytest.mark.parametrize("streaming", [False, True])
async def test_an_unexpected_error_is_logged_and_internal(
    streaming: bool, caplog: pytest.LogCaptureFixture
) -> None:
    async def unary(request: Message, call: GrpcCall) -> Message:
        raise RuntimeError("/secret/path broke")

    async def stream(call: GrpcCall) -> None:
        raise RuntimeError("/secret/path broke")

    with caplog.at_level(logging.ERROR):
        owner, _ = await (run_streaming(stream) if streaming else run_unary(unary))
        await settle_tasks()
    code, message = owner.status()
    assert code == StatusCode.INTERNAL and "secret" not in message
    assert any("/secret/path broke" in str(record.exc_info) for record in caplog.records)


@pytest.mark.parametrize("streaming", [False, True])
async def test_a_handler_task_the_server_cancels_ends_the_call_unavailable(streaming: bool) -> None:
    started = asyncio.Event()

    async def unary(request: Message, call: GrpcCall) -> Message:
        started.set()
        await asyncio.Event().wait()
        raise AssertionError("never reached")

    async def stream(call: GrpcCall) -> None:
        started.set()
        await asyncio.Event().wait()

    owner, call = await (run_streaming(stream) if streaming else run_unary(unary))
    await started.wait()
    [task] = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    task.cancel()  # as the loop's shutdown does: the call itself did not end
    await settle_tasks()
    assert owner.status() == (StatusCode.UNAVAILABLE, "the server is shutting down")
    assert call.ended


async def test_a_streaming_handler_that_returns_ends_ok() -> None:
    async def stream(call: GrpcCall) -> None:
        call.write(health_pb2.HealthCheckResponse())

    owner, call = await run_streaming(stream)
    await settle_tasks()
    assert [kind for kind, _ in owner.sent] == ["headers", "message", "trailers"]
    assert owner.status() == (StatusCode.OK, "")
    assert call.ended


async def test_a_cancelled_call_sends_nothing_more() -> None:
    started = asyncio.Event()

    async def stream(call: GrpcCall) -> None:
        started.set()
        await asyncio.Event().wait()

    owner, call = await run_streaming(stream)
    await started.wait()
    call.cancel()  # the client reset the stream
    await settle_tasks()
    assert owner.sent == []
