"""gRPC under overload on one HTTP/2 connection (issue 30, item 4), without sockets: a refused
ModelInfer is answered from its whole message with no call made, admitted calls run after the
reads (the loop's RunQueue, HTTP's), and a call the client reset in the same read, or before
its turn, is never started.

The connection is the real one over the real InferenceService, fed by h2's client state
machine through a transport that only records; the data plane's one model admits or refuses
as the test says and counts what reaches it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any, cast

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ortserve.core.dataplane import DataPlane
from ortserve.core.model import ModelState, Servable, VersionInfo
from ortserve.core.types import InferOutput, InferRequest, InferResponse, ServerMetadata, TensorSpec
from ortserve.errors import OrtServeError, Overloaded
from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.protocol.tensors import TensorLimits
from ortserve.server.connections import ByteBudget, ConnectionSet
from ortserve.server.grpc import connection as connection_module
from ortserve.server.grpc.call import GrpcCall
from ortserve.server.grpc.connection import Http2Connection
from ortserve.server.grpc.inflate import Inflater
from ortserve.server.grpc.messages import framed
from ortserve.server.grpc.options import GrpcOptions
from ortserve.server.grpc.service import InferenceService
from ortserve.server.http.run_queue import RunQueue

INFER = "/inference.GRPCInferenceService/ModelInfer"
SPEC = TensorSpec("x", "FP32", (-1, 4))
OPTIONS = GrpcOptions(
    max_message_bytes=1 << 20, keepalive_time_s=7200, keepalive_timeout_s=20, max_concurrent_streams=100
)


class Model:
    """Answers at once with its input doubled, or refuses while ``refusing``; counts submits."""

    info = VersionInfo("m", "1", (SPEC,), (SPEC,), 8, ("CPUExecutionProvider",))
    state = ModelState.READY
    ready = True

    def __init__(self) -> None:
        self.refusing = False
        self.submitted = 0
        self.asked = 0

    def refusal(self, priority: int = 0) -> OrtServeError | None:
        self.asked += 1
        return Overloaded("the queue is full", retry_after_s=2) if self.refusing else None

    def submit(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        self.submitted += 1
        data = request.inputs[0].data * 2
        answer: asyncio.Future[InferResponse] = asyncio.get_running_loop().create_future()
        answer.set_result(InferResponse("m", "1", [InferOutput("x", "FP32", data.shape, data)], request.id))
        return answer

    async def infer(self, request: InferRequest) -> InferResponse:
        return await self.submit(request)

    async def unload(self, grace_s: float) -> None:
        pass


class Models:
    def __init__(self, model: Model) -> None:
        self.model = model

    def resolve(self, name: str, version: str | None) -> Servable:
        return cast(Servable, self.model)

    def served_versions(self, name: str) -> tuple[str, ...]:
        return ("1",)

    @property
    def all_ready(self) -> bool:
        return True


class Recording:
    """A transport that keeps what is written."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def writelines(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            self.written += piece

    def take(self) -> bytes:
        data = bytes(self.written)
        self.written.clear()
        return data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


class Site:
    """One server connection and an h2 client speaking to it by hand."""

    def __init__(self, loop: asyncio.AbstractEventLoop, runs: RunQueue | None) -> None:
        self.model = Model()
        service = InferenceService(
            DataPlane(Models(self.model), ServerMetadata("ortserve", "0", ())), TensorLimits()
        )
        self.budget = ByteBudget(1 << 30)
        self.server = Http2Connection(
            service.routes(), OPTIONS, ConnectionSet(), loop, Inflater(loop), self.budget, runs
        )
        self.wire = Recording()
        self.server.connection_made(cast(asyncio.Transport, self.wire))
        self.client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.client.initiate_connection()
        self.send()
        self.status: dict[int, tuple[str, dict[str, str]]] = {}
        self.answers: dict[int, np.ndarray] = {}
        self.reset: set[int] = set()
        self.receive()

    def open(self, value: float, split: bool = False) -> int:
        """Queue one ModelInfer call (its message whole in one DATA frame, or split in two)."""
        stream_id = self.client.get_next_available_stream_id()
        request = pb.ModelInferRequest(model_name="m", id=str(stream_id))
        request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
        request.raw_input_contents.append(np.full((1, 4), value, np.float32).tobytes())
        headers = [(":method", "POST"), (":scheme", "http"), (":path", INFER), (":authority", "t")]
        self.client.send_headers(
            stream_id, [*headers, ("content-type", "application/grpc"), ("te", "trailers")]
        )
        message = framed(request.SerializeToString())
        if split:
            self.client.send_data(stream_id, message[:7])
            self.client.send_data(stream_id, message[7:], end_stream=True)
        else:
            self.client.send_data(stream_id, message, end_stream=True)
        return stream_id

    def cancel(self, stream_id: int) -> None:
        """Reset the stream, unless the client already has its end."""
        try:
            self.client.reset_stream(stream_id, 8)
        except h2.exceptions.StreamClosedError:
            return
        self.reset.add(stream_id)

    def send(self) -> None:
        """What the client queued arrives in one read."""
        data = self.client.data_to_send()
        if data:
            self.server.data_received(data)

    def receive(self) -> None:
        trailers: dict[int, dict[str, str]] = {}
        for event in self.client.receive_data(self.wire.take()):
            if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                fields = {k.decode(): v.decode() for k, v in event.headers}
                trailers.setdefault(event.stream_id, {}).update(fields)
                if "grpc-status" in fields:
                    self.status[event.stream_id] = (fields["grpc-status"], trailers[event.stream_id])
            elif isinstance(event, h2.events.DataReceived):
                self.client.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                answer = pb.ModelInferResponse.FromString(event.data[5:])
                self.answers[event.stream_id] = np.frombuffer(answer.raw_output_contents[0], np.float32)
        self.client.data_to_send()  # acknowledgements the server need not see


async def settle(site: Site) -> None:
    """Let the loop run the deferred turns and the answers' callbacks."""
    for _ in range(10):
        await asyncio.sleep(0)
    site.receive()


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The stream ids of the GrpcCalls the connection makes."""
    streams: list[int] = []

    class Counted(GrpcCall):
        __slots__ = ()

        def __init__(self, owner: Any, stream_id: int, *args: Any) -> None:
            streams.append(stream_id)
            super().__init__(owner, stream_id, *args)

    monkeypatch.setattr(connection_module, "GrpcCall", Counted)
    yield streams


async def test_a_refused_call_is_answered_from_its_whole_message_with_no_call_made(made: list[int]) -> None:
    site = Site(asyncio.get_running_loop(), RunQueue(asyncio.get_running_loop()))
    site.model.refusing = True
    streams = [site.open(1.0) for _ in range(3)]
    site.send()  # three whole calls in one read, answered within it: no loop turn needed
    site.receive()
    for stream_id in streams:
        status, fields = site.status[stream_id]
        assert status == "8", fields  # RESOURCE_EXHAUSTED
        assert int(fields["retry-after"]) >= 1
    assert made == []
    assert site.model.submitted == 0
    assert site.budget.held == 0


async def test_admitted_calls_run_after_the_reads_and_ask_again_at_their_turn(made: list[int]) -> None:
    loop = asyncio.get_running_loop()
    site = Site(loop, RunQueue(loop))
    first = site.open(1.0)
    site.send()
    assert made == [] and site.model.submitted == 0  # admitted, waiting for its turn
    assert site.budget.held > 0  # its message is held
    site.model.refusing = True
    second = site.open(2.0)
    site.send()  # read in the same iteration: refused before the first call runs
    site.receive()
    assert site.status[second][0] == "8" and first not in site.status
    await settle(site)
    # At its turn the queue is full: the first call is refused too, never decoded.
    assert site.status[first][0] == "8"
    assert site.model.submitted == 0 and site.budget.held == 0
    site.model.refusing = False
    third = site.open(3.0)
    site.send()
    await settle(site)
    assert site.status[third][0] == "0"
    np.testing.assert_array_equal(site.answers[third], np.full(4, 6.0, np.float32))
    assert site.model.submitted == 1 and site.budget.held == 0


async def test_a_call_reset_in_the_read_that_opens_it_is_never_started(made: list[int]) -> None:
    loop = asyncio.get_running_loop()
    site = Site(loop, RunQueue(loop))
    gone = site.open(1.0)
    site.cancel(gone)
    kept = site.open(2.0)
    site.send()
    await settle(site)
    assert made == [kept]
    assert site.model.submitted == 1 and gone not in site.status
    assert site.status[kept][0] == "0"
    np.testing.assert_array_equal(site.answers[kept], np.full(4, 4.0, np.float32))


async def test_an_admitted_call_reset_before_its_turn_is_dropped_and_its_bytes_given_back(
    made: list[int],
) -> None:
    loop = asyncio.get_running_loop()
    site = Site(loop, RunQueue(loop))
    stream_id = site.open(1.0)
    site.send()
    assert site.budget.held > 0
    site.cancel(stream_id)
    site.send()  # the reset comes in the next read, before the turn
    await settle(site)
    assert made == [] and site.model.submitted == 0 and site.budget.held == 0
    served = site.open(5.0)
    site.send()
    await settle(site)
    assert site.status[served][0] == "0"


async def test_a_message_split_over_frames_takes_the_calls_path(made: list[int]) -> None:
    loop = asyncio.get_running_loop()
    site = Site(loop, RunQueue(loop))
    stream_id = site.open(1.5, split=True)
    site.send()
    await settle(site)
    assert made == [stream_id]
    assert site.status[stream_id][0] == "0"
    np.testing.assert_array_equal(site.answers[stream_id], np.full(4, 3.0, np.float32))
    site.model.refusing = True
    refused = site.open(1.0, split=True)
    site.send()
    await settle(site)
    assert site.status[refused][0] == "8"  # refused by its call, as before
    assert site.model.submitted == 1 and site.budget.held == 0


async def test_without_a_run_queue_an_admitted_call_runs_within_the_read(made: list[int]) -> None:
    site = Site(asyncio.get_running_loop(), None)
    stream_id = site.open(2.0)
    site.send()
    assert site.model.submitted == 1  # decoded and submitted inside data_received
    await settle(site)
    assert site.status[stream_id][0] == "0"


# One step: (calls opened in this read, each (split, reset in this read, reset in the next read),
# whether the model refuses during this read, loop turns let run after it).
_CALL = st.tuples(st.booleans(), st.booleans(), st.booleans())
_STEP = st.tuples(st.lists(_CALL, max_size=4), st.booleans(), st.booleans())


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(_STEP, min_size=1, max_size=6))
def test_every_call_not_reset_ends_once_correct_or_refused_and_nothing_is_held(
    steps: list[tuple[list[tuple[bool, bool, bool]], bool, bool]],
) -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        site = Site(loop, RunQueue(loop))
        values: dict[int, float] = {}
        later: list[int] = []
        for calls, refusing, turn in steps:
            site.model.refusing = refusing
            for stream_id in later:
                site.cancel(stream_id)
            later = []
            for split, reset_now, reset_next in calls:
                value = float(len(values) + 1)
                stream_id = site.open(value, split)
                values[stream_id] = value
                if reset_now:
                    site.cancel(stream_id)
                elif reset_next:
                    later.append(stream_id)
            site.send()
            if turn:
                await settle(site)
        for stream_id in later:
            site.cancel(stream_id)
        site.send()
        site.model.refusing = False
        await settle(site)
        for stream_id, value in values.items():
            if stream_id in site.reset:
                continue  # may have ended either way before its reset arrived, or not at all
            status, fields = site.status[stream_id]
            assert status in ("0", "8"), fields
            if status == "0":
                np.testing.assert_array_equal(site.answers[stream_id], np.full(4, 2 * value, np.float32))
            else:
                assert int(fields["retry-after"]) >= 1
        assert site.budget.held == 0
        assert site.server._calls == {} and site.server._admitted == {} and site.server._heads == {}

    asyncio.run(run())
