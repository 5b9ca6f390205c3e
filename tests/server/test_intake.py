"""Transport back-pressure (issue 10): while the event loop lags, connections stop being read
after the data they delivered is handled, and are read again once it catches up."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ortserve.core.dataplane import DataPlane
from ortserve.core.model import ServedVersion
from ortserve.core.types import ServerMetadata
from ortserve.errors import ModelNotFound
from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.protocol.tensors import TensorLimits
from ortserve.server import intake as intake_module
from ortserve.server.connections import ByteBudget
from ortserve.server.grpc.listener import GrpcListener, GrpcOptions
from ortserve.server.http.connection import ConnectionLimits
from ortserve.server.http.listener import HttpListener
from ortserve.server.http.messages import HttpRequest, HttpResponse, json_response
from ortserve.server.intake import IntakeGovernor
from ortserve.settings import ServerSettings
from waiting import until

LIMITS = ConnectionLimits(max_body_bytes=1 << 20, keepalive_timeout_s=30.0, header_timeout_s=30.0)


class Connection:
    def __init__(self) -> None:
        self.parked = False

    def park(self) -> None:
        self.parked = True

    def unpark(self) -> None:
        self.parked = False


def block_the_loop(seconds: float) -> None:
    """Stands for a long stretch of callbacks (parsing a burst of requests): CPU work."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def be_descheduled(seconds: float) -> None:
    """Stands for a process the machine did not run (a busy host, a CPU quota)."""
    time.sleep(seconds)  # real time off the CPU is the case under test: the governor reads both clocks


class Sampled(IntakeGovernor):
    """A governor that keeps the lag of each sample it took, so a test can wait for a sample."""

    def __init__(self, high_s: float) -> None:
        super().__init__(high_s)
        self.lags: list[float] = []

    def _sample(self) -> None:
        super()._sample()
        self.lags.append(self.lag_s)


async def test_a_lagging_loop_is_detected_and_a_quiet_one_recovers() -> None:
    governor = IntakeGovernor(0.020)
    governor.start(asyncio.get_running_loop())
    try:
        quiet = Connection()
        governor.admit_more(quiet)
        assert not quiet.parked  # an idle loop reads everything
        block_the_loop(0.060)  # the next sample is 60 ms late, the loop's own work
        await until(lambda: governor.episodes == 1, 5, "a saturation episode")
        await until(lambda: not governor.saturated, 5, "recovery")  # the loop is idle again
    finally:
        governor.stop()


async def test_the_sampler_resumes_what_was_parked_once_the_loop_is_quiet() -> None:
    governor = IntakeGovernor(0.020)
    governor.saturated = True  # as a sample of a saturated loop leaves it
    busy = [Connection() for _ in range(3)]
    for connection in busy:
        governor.admit_more(connection)
    assert all(c.parked for c in busy) and governor.parked == 3
    governor.forget(busy[2])  # closed while parked
    governor.start(asyncio.get_running_loop())
    try:
        await until(lambda: governor.parked == 0, 5, "every connection resumed")
        assert not governor.saturated
        assert [c.parked for c in busy] == [False, False, True]
    finally:
        governor.stop()


async def test_a_late_timer_without_loop_work_is_not_saturation() -> None:
    governor = Sampled(0.020)
    governor.start(asyncio.get_running_loop())
    try:
        be_descheduled(0.060)
        await until(lambda: any(lag > 0.040 for lag in governor.lags), 5, "the late sample")
        assert governor.episodes == 0 and not governor.saturated
    finally:
        governor.stop()


async def test_a_disabled_governor_never_samples_or_parks() -> None:
    governor = Sampled(0.0)
    witness = Sampled(0.020)  # an enabled one beside it: its late sample shows the timers ran
    governor.start(asyncio.get_running_loop())
    witness.start(asyncio.get_running_loop())
    try:
        block_the_loop(0.05)
        await until(lambda: any(lag > 0.030 for lag in witness.lags), 5, "the witness's late sample")
        assert governor.lags == []
        connection = Connection()
        governor.admit_more(connection)
        assert not governor.saturated and not connection.parked
    finally:
        witness.stop()


async def test_resuming_is_bounded_per_sample_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(intake_module, "_RESUME_PER_SAMPLE", 2)
    governor = IntakeGovernor(0.020)
    governor.saturated = True
    parked = [Connection() for _ in range(5)]
    for connection in parked:
        governor.admit_more(connection)
    governor.saturated = False
    governor._loop = asyncio.get_running_loop()
    governor._due = governor._loop.time()
    governor._sample()  # one sample, under the low mark: two resumed, the oldest first
    assert [c.parked for c in parked] == [False, False, True, True, True]
    governor.stop()  # shutdown reads everything again
    assert not any(c.parked for c in parked)


def answer(request: HttpRequest) -> HttpResponse:
    return json_response(200, b'{"path":"%s"}' % request.path.encode())


async def http_get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str) -> bytes:
    writer.write(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode())
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return await reader.readexactly(length)


async def test_http_connections_stop_being_read_while_saturated() -> None:
    governor = IntakeGovernor(0.020)  # not sampling: the test says when the loop is saturated
    listener = HttpListener(answer, LIMITS, intake=governor)
    port = await listener.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        assert await http_get(reader, writer, "/a") == b'{"path":"/a"}'
        governor.saturated = True
        assert await http_get(reader, writer, "/b") == b'{"path":"/b"}'  # read, answered, parked
        assert governor.parked == 1
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(http_get(reader, writer, "/c"), 0.3)
        governor.stop()  # caught up: read again, and the waiting request is answered
        assert await reader.readuntil(b'{"path":"/c"}')
        assert await http_get(reader, writer, "/d") == b'{"path":"/d"}'
    finally:
        writer.transport.abort()
        listener.stop_accepting()
        await listener.wait_closed(0.5)


class NoModels:
    """A repository that is ready and serves nothing (health checks need no model)."""

    all_ready = True

    def resolve(self, name: str, version: str | None) -> ServedVersion:
        raise ModelNotFound(f"unknown model {name!r}")

    def served_versions(self, name: str) -> tuple[str, ...]:
        return ()


@pytest.fixture
async def grpc_site() -> AsyncIterator[tuple[IntakeGovernor, int]]:
    governor = IntakeGovernor(0.020)
    dataplane = DataPlane(NoModels(), ServerMetadata("ortserve", "test", ()))
    options = GrpcOptions.from_settings(ServerSettings(Path(".")))
    listener = GrpcListener(dataplane, TensorLimits(), options, intake=governor)
    port = await listener.start("127.0.0.1", 0)
    yield governor, port
    governor.stop()
    listener.stop_accepting(0.5)
    await listener.wait_closed()


async def test_grpc_connections_stop_being_read_while_saturated(
    grpc_site: tuple[IntakeGovernor, int],
) -> None:
    governor, port = grpc_site
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest()
        assert (await health.Check(request, timeout=5)).status == health_pb2.HealthCheckResponse.SERVING
        governor.saturated = True
        assert (await health.Check(request, timeout=5)).status == health_pb2.HealthCheckResponse.SERVING
        assert governor.parked == 1
        with pytest.raises(grpc.aio.AioRpcError) as waited:
            await health.Check(request, timeout=0.3)
        assert waited.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        governor.stop()
        assert (await health.Check(request, timeout=5)).status == health_pb2.HealthCheckResponse.SERVING


async def test_grpc_request_bytes_count_against_the_server_wide_budget() -> None:
    budget = ByteBudget(64 * 1024)
    dataplane = DataPlane(NoModels(), ServerMetadata("ortserve", "test", ()))
    options = GrpcOptions.from_settings(ServerSettings(Path(".")))
    listener = GrpcListener(dataplane, TensorLimits(), options, budget=budget)
    port = await listener.start("127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            infer = channel.unary_unary(
                "/inference.GRPCInferenceService/ModelInfer",
                request_serializer=pb.ModelInferRequest.SerializeToString,
                response_deserializer=pb.ModelInferResponse.FromString,
            )
            small = pb.ModelInferRequest(model_name="absent", raw_input_contents=[b"\0" * 1024])
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await infer(small, timeout=5)
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND  # within the budget
            large = pb.ModelInferRequest(model_name="absent", raw_input_contents=[b"\0" * (256 * 1024)])
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await infer(large, timeout=5)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "request bytes" in (refused.value.details() or "")
            with pytest.raises(grpc.aio.AioRpcError) as again:
                await infer(small, timeout=5)
            assert again.value.code() == grpc.StatusCode.NOT_FOUND
        assert budget.held == 0  # every byte taken was given back
    finally:
        listener.stop_accepting(0.5)
        await listener.wait_closed()
