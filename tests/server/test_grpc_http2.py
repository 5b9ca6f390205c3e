"""The gRPC listener's HTTP/2 against a hand-driven client: framing, flow control, limits, errors, drain.

The client is h2's state machine on an asyncio socket, which also checks what the server
sends (frame sizes, windows, header blocks); tests add raw frames where no well-behaved
client would. Each case ends by showing the server still serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest
from grpc_health.v1 import health_pb2
from h2.errors import ErrorCodes

from ortserve.core.dataplane import DataPlane
from ortserve.core.model import ModelState, VersionInfo
from ortserve.core.types import InferOutput, InferRequest, InferResponse, ServerMetadata, TensorSpec
from ortserve.errors import ModelNotFound, OrtServeError
from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.protocol.tensors import TensorLimits
from ortserve.server.grpc.errors import StatusCode
from ortserve.server.grpc.listener import GrpcListener, GrpcOptions

SERVICE = "/inference.GRPCInferenceService"
LIVE, INFER, STREAM_INFER = f"{SERVICE}/ServerLive", f"{SERVICE}/ModelInfer", f"{SERVICE}/ModelStreamInfer"
WATCH = "/grpc.health.v1.Health/Watch"
MAX_MESSAGE = 1 << 20
MAX_WINDOW = 2**31 - 1
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    range(10)
)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
INITIAL_WINDOW_SIZE = h2.settings.SettingCodes.INITIAL_WINDOW_SIZE


# -- the server: a listener in process on fake models -----------------------------------
class FakeModel:
    """Echoes input ``x`` (UINT8) as output ``y``: at once, or when the test releases it."""

    def __init__(self, name: str, held: bool = False) -> None:
        spec = (TensorSpec("x", "UINT8", (-1,)),)
        self.info = VersionInfo(name, "1", spec, (TensorSpec("y", "UINT8", (-1,)),), 0, ())
        self.state = ModelState.READY
        self.held = held
        self.requests: list[InferRequest] = []
        self.pending: list[tuple[asyncio.Future[InferResponse], InferResponse]] = []

    @property
    def ready(self) -> bool:
        return True

    def refusal(self, priority: int = 0) -> OrtServeError | None:
        return None

    def submit(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        self.requests.append(request)
        data = request.inputs[0].data
        response = InferResponse(
            self.info.name, "1", [InferOutput("y", "UINT8", data.shape, data)], request.id
        )
        answer: asyncio.Future[InferResponse] = asyncio.get_running_loop().create_future()
        if self.held:
            self.pending.append((answer, response))
        else:
            answer.set_result(response)
        return answer

    def release(self) -> None:
        for answer, response in self.pending:
            if not answer.done():
                answer.set_result(response)

    async def infer(self, request: InferRequest) -> InferResponse:
        return await self.submit(request)

    async def unload(self, grace_s: float) -> None:
        return None


class FakeResolver:
    all_ready = True

    def __init__(self, *models: FakeModel) -> None:
        self.models = {model.info.name: model for model in models}

    def resolve(self, name: str, version: str | None) -> FakeModel:
        if name not in self.models:
            raise ModelNotFound(f"unknown model {name!r}")
        return self.models[name]

    def served_versions(self, name: str) -> tuple[str, ...]:
        return ("1",)


@dataclass
class Server:
    listener: GrpcListener
    port: int
    echo: FakeModel
    held: FakeModel
    clients: list[Client] = field(default_factory=list)

    async def connect(
        self, window: int | None = None, max_frame: int | None = None, ready: bool = True
    ) -> Client:
        """A client; ``ready`` waits until both sides' SETTINGS are exchanged."""
        client = await Client.connect(self.port, window, max_frame, ready)
        self.clients.append(client)
        return client


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[Server]]]:
    servers: list[Server] = []

    async def start(**options: float) -> Server:
        echo, held = FakeModel("echo"), FakeModel("held", held=True)
        dataplane = DataPlane(FakeResolver(echo, held), ServerMetadata("ortserve", "test", ()))
        fields = dict(
            max_message_bytes=MAX_MESSAGE,
            keepalive_time_s=7200.0,
            keepalive_timeout_s=20.0,
            max_concurrent_streams=100,
        )
        listener = GrpcListener(dataplane, TensorLimits(), GrpcOptions(**(fields | options)))  # type: ignore[arg-type]
        server = Server(listener, await listener.start("127.0.0.1", 0), echo, held)
        servers.append(server)
        return server

    yield start
    for server in servers:
        for client in server.clients:
            await client.close()
        server.listener.stop_accepting(0.1)
        await server.listener.wait_closed()


@pytest.fixture
async def server(serve: Callable[..., Awaitable[Server]]) -> Server:
    return await serve()


# -- the client ---------------------------------------------------------------------------
@dataclass
class Frame:
    kind: int
    flags: int
    stream: int
    payload: bytes


def split_frames(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Whole frames (header and payload) at the front of ``buffer``, and what is left."""
    frames = []
    while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
        end = 9 + int.from_bytes(buffer[:3], "big")
        frames.append(buffer[:end])
        buffer = buffer[end:]
    return frames, buffer


def parse(raw: bytes) -> Frame:
    return Frame(raw[3], raw[4], int.from_bytes(raw[5:9], "big") & MAX_WINDOW, raw[9:])


def raw_frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def setting(code: int, value: int) -> bytes:
    return raw_frame(SETTINGS, 0, 0, code.to_bytes(2, "big") + value.to_bytes(4, "big"))


@dataclass
class Stream:
    headers: dict[str, str] = field(default_factory=dict)
    data: bytearray = field(default_factory=bytearray)
    trailers: dict[str, str] | None = None
    ended: bool = False
    reset: int | None = None

    @property
    def done(self) -> bool:
        return self.ended or self.reset is not None

    @property
    def status(self) -> int:
        """grpc-status from the trailers, or from the only header block of a trailers-only answer."""
        return int((self.headers if self.trailers is None else self.trailers)["grpc-status"])

    @property
    def message(self) -> str:
        return (self.headers if self.trailers is None else self.trailers).get("grpc-message", "")

    def messages(self) -> list[bytes]:
        out, data = [], bytes(self.data)
        while data:
            assert data[0] == 0, "the server compressed an answer"
            end = 5 + int.from_bytes(data[1:5], "big")
            assert len(data) >= end, "an answer ended inside a message"
            out.append(data[5:end])
            data = data[end:]
        return out


class Client:
    """h2 over an asyncio socket; every frame received is also kept raw in :attr:`frames`.

    GOAWAY is recorded here and kept from h2, which refuses every frame after one, while a
    graceful GOAWAY lets the streams it covers finish.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        config = h2.config.H2Configuration(
            client_side=True,
            header_encoding="utf-8",
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        self.conn = h2.connection.H2Connection(config)
        self.frames: list[Frame] = []
        self.streams: dict[int, Stream] = {}
        self.pings: list[bytes] = []
        self.goaway: tuple[int, int] | None = None
        """(error code, last stream id) of the server's GOAWAY."""
        self.closed = False
        self.auto_ack = True
        """Give DATA's flow-control credit back as it arrives."""
        self.answering = True
        """Send what h2 answers (SETTINGS and PING ACKs, window updates)."""
        self._buffer = b""
        self._settled = [False, False]

    @classmethod
    async def connect(cls, port: int, window: int | None, max_frame: int | None, ready: bool) -> Client:
        client = cls(*await asyncio.open_connection("127.0.0.1", port))
        settings = {h2.settings.SettingCodes.ENABLE_PUSH: 0}
        if window is not None:
            settings[INITIAL_WINDOW_SIZE] = window
        if max_frame is not None:
            settings[h2.settings.SettingCodes.MAX_FRAME_SIZE] = max_frame
            client.conn.max_inbound_frame_size = max_frame
        client.conn.local_settings = h2.settings.Settings(client=True, initial_values=settings)
        client.conn.initiate_connection()
        client.flush()
        if ready:
            await client.until(lambda: all(client._settled))
        return client

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)

    def raw(self, data: bytes) -> None:
        self.flush()
        self.writer.write(data)

    def start(
        self,
        path: str,
        metadata: tuple[tuple[str, str], ...] = (),
        method: str = "POST",
        content_type: str = "application/grpc",
        headers: list[tuple[str, str]] | None = None,
        end_stream: bool = False,
        **priority: int | bool,
    ) -> int:
        """Open a stream with a request head; returns its id."""
        if headers is None:
            headers = [
                (":method", method),
                (":scheme", "http"),
                (":path", path),
                (":authority", "test"),
                ("content-type", content_type),
                ("te", "trailers"),
                *metadata,
            ]
        stream_id = self.conn.get_next_available_stream_id()
        self.streams[stream_id] = Stream()
        self.conn.send_headers(stream_id, headers, end_stream=end_stream, **priority)  # type: ignore[arg-type]
        self.flush()
        return stream_id

    def send(
        self, stream_id: int, data: bytes, end_stream: bool = False, size: int = 0, pad: int | None = None
    ) -> None:
        """DATA frames of at most ``size`` bytes (the largest the server takes when 0)."""
        size = size or self.conn.max_outbound_frame_size - (0 if pad is None else pad + 1)
        chunks = [data[i : i + size] for i in range(0, len(data), size)] or [b""]
        for i, chunk in enumerate(chunks):
            last = end_stream and i == len(chunks) - 1
            self.conn.send_data(stream_id, chunk, end_stream=last, pad_length=pad)
        self.flush()

    async def call(self, path: str, message: bytes, **head: object) -> Stream:
        stream_id = self.start(path, **head)  # type: ignore[arg-type]
        self.send(stream_id, framed(message), end_stream=True)
        return await self.response(stream_id)

    async def response(self, stream_id: int) -> Stream:
        stream = self.streams[stream_id]
        await self.until(lambda: stream.done)
        return stream

    async def sync(self) -> None:
        """A PING round trip: the server has handled every frame sent before it."""
        payload = os.urandom(8)
        self.conn.ping(payload)
        self.flush()
        await self.until(lambda: payload in self.pings)

    async def until(self, done: Callable[[], bool]) -> None:
        """Read and handle frames until ``done()``; fails after 5 s or when the server closed."""
        async with asyncio.timeout(5.0):
            while not done():
                assert not self.closed, "the server closed the connection"
                await self._read()

    async def _read(self) -> None:
        try:
            data = await self.reader.read(1 << 16)
        except ConnectionError:
            data = b""
        if not data:
            self.closed = True
            return
        frames, self._buffer = split_frames(self._buffer + data)
        for raw in frames:
            frame = parse(raw)
            self.frames.append(frame)
            if frame.kind == GOAWAY:
                code = int.from_bytes(frame.payload[4:8], "big")
                self.goaway = (code, int.from_bytes(frame.payload[:4], "big"))
                continue
            for event in self.conn.receive_data(raw):
                self._on(event)
        if self.answering:
            self.flush()

    def _on(self, event: h2.events.Event) -> None:
        stream = self.streams.get(getattr(event, "stream_id", 0) or 0)
        if isinstance(event, h2.events.ResponseReceived):
            assert stream is not None
            stream.headers = dict(event.headers)  # type: ignore[arg-type]
        elif isinstance(event, h2.events.DataReceived):
            assert stream is not None and event.data is not None
            stream.data += event.data
            if self.auto_ack:
                self.conn.acknowledge_received_data(event.flow_controlled_length or 0, event.stream_id or 0)
        elif isinstance(event, h2.events.TrailersReceived):
            assert stream is not None
            stream.trailers = dict(event.headers)  # type: ignore[arg-type]
        elif isinstance(event, h2.events.StreamEnded):
            assert stream is not None
            stream.ended = True
        elif isinstance(event, h2.events.StreamReset):
            assert stream is not None
            stream.reset = event.error_code
        elif isinstance(event, h2.events.PingAckReceived):
            self.pings.append(event.ping_data or b"")
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self._settled[0] = True
        elif isinstance(event, h2.events.SettingsAcknowledged):
            self._settled[1] = True

    def frames_on(self, stream_id: int, kind: int) -> list[Frame]:
        return [frame for frame in self.frames if frame.stream == stream_id and frame.kind == kind]


def framed(payload: bytes, flag: int = 0) -> bytes:
    return bytes((flag,)) + len(payload).to_bytes(4, "big") + payload


def infer_request(model: str, data: bytes, **fields: Any) -> bytes:
    message = pb.ModelInferRequest(model_name=model, **fields)
    message.inputs.add(name="x", datatype="UINT8", shape=[len(data)])
    message.raw_input_contents.append(data)
    return bytes(message.SerializeToString())


def echoed(stream: Stream) -> bytes:
    assert stream.status == StatusCode.OK, stream.message
    [message] = stream.messages()
    return bytes(pb.ModelInferResponse.FromString(message).raw_output_contents[0])


async def assert_serves(client: Client) -> None:
    """A ServerLive call succeeds on this connection."""
    stream = await client.call(LIVE, b"")
    assert stream.status == StatusCode.OK, stream.message
    assert pb.ServerLiveResponse.FromString(stream.messages()[0]).live


def streaming_handler() -> asyncio.Task[object]:
    """The one streaming handler running in this loop."""
    [task] = [t for t in asyncio.all_tasks() if "_run_streaming" in t.get_coro().__qualname__]  # type: ignore[union-attr]
    return task


async def assert_ends(task: asyncio.Task[object]) -> None:
    await asyncio.wait((task,), timeout=2.0)
    assert task.done()


PAYLOAD = bytes(range(256)) * 4


# -- framing -------------------------------------------------------------------------------
async def test_a_message_split_into_tiny_frames_through_its_prefix_is_reassembled(server: Server) -> None:
    client = await server.connect()
    stream_id = client.start(INFER)
    client.send(stream_id, framed(infer_request("echo", PAYLOAD)), size=3)  # the prefix spans 2 frames
    client.send(stream_id, b"", end_stream=True)
    assert echoed(await client.response(stream_id)) == PAYLOAD
    await assert_serves(client)


async def test_padded_data_and_a_header_block_with_priority_are_understood(server: Server) -> None:
    client = await server.connect()
    stream_id = client.start(INFER, priority_weight=200, priority_depends_on=0, priority_exclusive=True)
    client.send(stream_id, framed(infer_request("echo", PAYLOAD)), size=100, pad=255)
    client.send(stream_id, b"", end_stream=True, pad=7)
    assert echoed(await client.response(stream_id)) == PAYLOAD
    await assert_serves(client)


async def test_a_header_block_split_into_continuation_frames_is_reassembled(server: Server) -> None:
    client = await server.connect()
    saved, client.conn.max_outbound_frame_size = client.conn.max_outbound_frame_size, 16
    stream_id = client.start(INFER, metadata=(("x-note", "n" * 300),))
    client.conn.max_outbound_frame_size = saved
    client.send(stream_id, framed(infer_request("echo", PAYLOAD)), end_stream=True)
    assert echoed(await client.response(stream_id)) == PAYLOAD
    await assert_serves(client)


async def test_a_continuation_flood_is_cut_off_after_a_bounded_number_of_frames(server: Server) -> None:
    """CVE-2024-27316's class: a header block that never ends, in 16,000 empty CONTINUATION frames."""
    client = await server.connect()
    flood = raw_frame(HEADERS, 0, 1, b"\x83") + raw_frame(CONTINUATION, 0, 1) * 16_000
    client.raw(flood)
    await client.until(lambda: client.goaway is not None)
    assert client.goaway is not None and client.goaway[0] == ErrorCodes.ENHANCE_YOUR_CALM
    await client.until(lambda: client.closed)
    await assert_serves(await server.connect())


async def test_a_header_block_in_more_continuation_frames_than_allowed_is_refused(server: Server) -> None:
    client = await server.connect()
    client.conn.max_outbound_frame_size = 16
    client.start(INFER, metadata=(("x-note", "n" * 1600),))  # 100 frames of 16 bytes or more
    await client.until(lambda: client.goaway is not None)
    assert client.goaway is not None and client.goaway[0] == ErrorCodes.ENHANCE_YOUR_CALM
    await assert_serves(await server.connect())


async def test_request_trailers_end_the_request(server: Server) -> None:
    client = await server.connect()
    stream_id = client.start(INFER)
    client.send(stream_id, framed(infer_request("echo", PAYLOAD)))
    client.conn.send_headers(stream_id, [("x-checksum", "abc")], end_stream=True)
    client.flush()
    assert echoed(await client.response(stream_id)) == PAYLOAD
    await assert_serves(client)


# -- flow control and frame sizes -----------------------------------------------------------
async def blocked_echo(server: Server, payload: bytes) -> tuple[Client, int, Stream]:
    """A client with a 1 KiB window whose echo call has filled it; it acknowledges nothing itself."""
    client = await server.connect(window=1024)
    client.auto_ack = False
    stream_id = client.start(INFER)
    client.send(stream_id, framed(infer_request("echo", payload)), end_stream=True)
    stream = client.streams[stream_id]
    await client.until(lambda: len(stream.data) == 1024)
    return client, stream_id, stream


async def test_an_answer_larger_than_the_clients_window_waits_for_window_updates(server: Server) -> None:
    payload = os.urandom(40_000)
    client, stream_id, stream = await blocked_echo(server, payload)
    await client.sync()
    assert len(stream.data) == 1024 and not stream.done  # the server waits within the window
    while not stream.done:
        client.conn.increment_flow_control_window(4096, stream_id)
        client.conn.increment_flow_control_window(4096)
        client.flush()
        before = len(stream.data)
        await client.until(lambda: len(stream.data) > before or stream.done)  # noqa: B023
    assert echoed(stream) == payload
    assert max(len(frame.payload) for frame in client.frames_on(stream_id, DATA)) <= 4096
    last = [frame for frame in client.frames if frame.stream == stream_id][-1]
    assert (last.kind, last.flags & END_STREAM) == (HEADERS, END_STREAM)  # trailers come last
    await assert_serves(client)


async def test_a_larger_initial_window_mid_stream_releases_the_rest(server: Server) -> None:
    payload = os.urandom(40_000)
    client, stream_id, _ = await blocked_echo(server, payload)
    # h2 trusts the new window only once the server acknowledged it: DATA sent before that
    # ACK would be a flow-control error here.
    client.conn.update_settings({INITIAL_WINDOW_SIZE: 1 << 20})
    client.flush()
    assert echoed(await client.response(stream_id)) == payload
    await assert_serves(client)


async def test_a_smaller_initial_window_mid_stream_stops_the_answer(server: Server) -> None:
    client, stream_id, stream = await blocked_echo(server, os.urandom(40_000))
    client.conn.update_settings({INITIAL_WINDOW_SIZE: 0})  # the stream's window goes to -1024
    client.flush()
    client.conn.increment_flow_control_window(1024, stream_id)  # back to 0: still nothing to send
    client.flush()
    await client.sync()
    assert len(stream.data) == 1024
    client.conn.increment_flow_control_window(100, stream_id)
    client.flush()
    await client.until(lambda: len(stream.data) == 1124)
    client.conn.reset_stream(stream_id)
    client.conn.update_settings({INITIAL_WINDOW_SIZE: 65_535})  # new streams may get answers again
    client.flush()
    await assert_serves(client)


@pytest.mark.parametrize("max_frame", [None, 40_000])
async def test_data_frames_fill_but_never_exceed_the_clients_max_frame_size(
    server: Server, max_frame: int | None
) -> None:
    client = await server.connect(window=1 << 20, max_frame=max_frame)
    payload = os.urandom(200_000)
    stream_id = client.start(INFER)
    client.send(stream_id, framed(infer_request("echo", payload)), end_stream=True)
    assert echoed(await client.response(stream_id)) == payload
    sizes = [len(frame.payload) for frame in client.frames_on(stream_id, DATA)]
    assert max(sizes) == (max_frame or 16_384)
    await assert_serves(client)


async def test_a_long_error_message_still_fits_the_clients_frames(server: Server) -> None:
    client = await server.connect()
    path = "/no.Such/" + "m" * 30_000
    stream = await client.call(path, b"")
    assert stream.status == StatusCode.UNIMPLEMENTED
    assert stream.message.startswith("unknown method /no.Such/mmm")
    assert len(stream.message) <= 8192  # gRPC clients refuse trailers past 8 KiB by default
    await assert_serves(client)


async def test_a_stream_window_overflow_resets_only_that_stream(server: Server) -> None:
    client = await server.connect()
    stream_id = client.start(INFER)
    client.send(stream_id, framed(infer_request("held", b"x")), end_stream=True)
    await client.sync()
    client.raw(raw_frame(WINDOW_UPDATE, 0, stream_id, MAX_WINDOW.to_bytes(4, "big")))
    assert (await client.response(stream_id)).reset == ErrorCodes.FLOW_CONTROL_ERROR
    [(pending, _)] = server.held.pending
    assert pending.cancelled()
    await assert_serves(client)


async def test_a_settings_change_that_overflows_a_stream_window_is_a_connection_error(server: Server) -> None:
    client = await server.connect()
    stream_id = client.start(INFER)
    client.send(stream_id, framed(infer_request("held", b"x")), end_stream=True)
    await client.sync()
    client.raw(raw_frame(WINDOW_UPDATE, 0, stream_id, (MAX_WINDOW - 65_535).to_bytes(4, "big")))
    client.raw(setting(INITIAL_WINDOW_SIZE, 65_536))
    await client.until(lambda: client.goaway is not None)
    assert client.goaway is not None and client.goaway[0] == ErrorCodes.FLOW_CONTROL_ERROR
    await assert_serves(await server.connect())


# -- message limits and compression -------------------------------------------------------
@pytest.mark.parametrize("declared", [MAX_MESSAGE + 1, 2**32 - 1])
async def test_a_message_declared_over_the_limit_is_refused_before_its_bytes_arrive(
    server: Server, declared: int
) -> None:
    client = await server.connect()
    stream_id = client.start(INFER)
    client.send(stream_id, b"\x00" + declared.to_bytes(4, "big") + b"abc")  # the rest never comes
    stream = await client.response(stream_id)
    assert stream.status == StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in stream.message
    await client.until(lambda: stream.reset is not None)
    assert stream.reset == ErrorCodes.NO_ERROR  # told to stop sending the rest
    await assert_serves(client)


async def test_a_declared_length_is_not_allocated_before_the_bytes_arrive(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    server = await serve(max_message_bytes=64 << 20)
    client = await server.connect()
    stream_id = client.start(INFER)
    tracemalloc.start()
    try:
        client.send(stream_id, b"\x00" + (64 << 20).to_bytes(4, "big") + b"abc")
        await client.sync()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20
    client.conn.reset_stream(stream_id)
    await assert_serves(client)


async def test_complete_requests_waiting_for_their_end_of_stream_count_against_the_connection(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    server = await serve(max_message_bytes=256 << 10)  # a connection holds 2 x 256 KiB + 4 MiB
    client = await server.connect()
    body = framed(infer_request("echo", bytes(250 << 10)))
    stream_ids = []
    for _ in range(40):  # 10 MiB of whole requests on streams that never end
        stream_ids.append(client.start(INFER))
        client.send(stream_ids[-1], body)
    await client.sync()
    refused = [client.streams[i] for i in stream_ids if client.streams[i].done]
    assert refused and len(refused) < len(stream_ids)
    assert {stream.status for stream in refused} == {StatusCode.RESOURCE_EXHAUSTED}
    for stream_id in stream_ids:
        if not client.streams[stream_id].done:
            client.send(stream_id, b"", end_stream=True)
    for stream_id in stream_ids:
        stream = await client.response(stream_id)
        assert stream.status in (StatusCode.OK, StatusCode.RESOURCE_EXHAUSTED)
    await assert_serves(client)


ECHO = infer_request("echo", b"compress me " * 200)


@pytest.mark.parametrize(
    ("encoding", "flag", "body", "code"),
    [
        pytest.param("gzip", 1, gzip.compress(ECHO), StatusCode.OK, id="gzip"),
        pytest.param("deflate", 1, zlib.compress(ECHO), StatusCode.OK, id="deflate"),
        pytest.param("gzip", 0, ECHO, StatusCode.OK, id="gzip-announced-but-plain"),
        pytest.param("snappy", 1, ECHO, StatusCode.UNIMPLEMENTED, id="unknown-encoding"),
        pytest.param(None, 1, gzip.compress(ECHO), StatusCode.INTERNAL, id="flag-without-encoding"),
        pytest.param(
            "gzip", 1, gzip.compress(bytes(4 * MAX_MESSAGE)), StatusCode.RESOURCE_EXHAUSTED, id="bomb"
        ),
        pytest.param("gzip", 1, gzip.compress(ECHO)[:-8], StatusCode.INTERNAL, id="gzip-trailer-cut"),
        pytest.param("gzip", 1, gzip.compress(ECHO)[:30], StatusCode.INTERNAL, id="gzip-cut"),
        pytest.param("gzip", 1, b"not gzip at all", StatusCode.INTERNAL, id="not-gzip"),
        pytest.param("gzip", 2, ECHO, StatusCode.INTERNAL, id="unknown-flag"),
    ],
)
async def test_compressed_requests(
    server: Server, encoding: str | None, flag: int, body: bytes, code: StatusCode
) -> None:
    client = await server.connect()
    metadata = () if encoding is None else (("grpc-encoding", encoding),)
    stream_id = client.start(INFER, metadata=metadata)
    client.send(stream_id, framed(body, flag), end_stream=True)
    stream = await client.response(stream_id)
    assert stream.status == code, stream.message
    if code == StatusCode.OK:
        assert echoed(stream) == b"compress me " * 200
    if code == StatusCode.UNIMPLEMENTED:
        assert "gzip" in stream.headers["grpc-accept-encoding"]
    await assert_serves(client)


async def test_a_compressed_message_inflating_over_several_ticks_keeps_its_place_on_a_stream(
    server: Server,
) -> None:
    client = await server.connect()
    stream_id = client.start(STREAM_INFER, metadata=(("grpc-encoding", "gzip"),))
    big = bytes(range(256)) * 2400  # 600 KiB: more than one tick's inflation budget
    client.send(stream_id, framed(gzip.compress(infer_request("echo", big)), 1))
    client.send(stream_id, framed(infer_request("echo", b"second")), end_stream=True)
    stream = await client.response(stream_id)
    assert stream.status == StatusCode.OK, stream.message
    answers = [pb.ModelStreamInferResponse.FromString(m).infer_response for m in stream.messages()]
    assert [bytes(a.raw_output_contents[0]) for a in answers] == [big, b"second"]


async def test_a_stream_runs_a_bounded_number_of_requests_and_reads_the_rest_as_slots_free(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests on one ModelStreamInfer call beyond STREAM_IN_FLIGHT stay unread (and
    unparsed) until one finishes; every one is answered in the end."""
    from ortserve.server.grpc import service

    monkeypatch.setattr(service, "STREAM_IN_FLIGHT", 8)
    client = await server.connect()
    stream_id = client.start(STREAM_INFER)
    for index in range(30):
        client.send(stream_id, framed(infer_request("held", bytes([index]))))
    client.send(stream_id, b"", end_stream=True)
    await client.sync()
    assert len(server.held.requests) == 8
    released = 0
    while released < 30:
        await client.until(lambda seen=released: len(server.held.pending) > seen)  # type: ignore[misc]
        released = len(server.held.pending)
        server.held.release()
    stream = await client.response(stream_id)
    assert stream.status == StatusCode.OK, stream.message
    answers = [pb.ModelStreamInferResponse.FromString(m).infer_response for m in stream.messages()]
    assert sorted(bytes(a.raw_output_contents[0]) for a in answers) == [bytes([i]) for i in range(30)]
    await assert_serves(client)


# -- refusals and malformed requests --------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path", "content_type", "http_status", "code"),
    [
        ("POST", f"{SERVICE}/NoSuchMethod", "application/grpc", "200", StatusCode.UNIMPLEMENTED),
        ("POST", "/no.Such/Service", "application/grpc", "200", StatusCode.UNIMPLEMENTED),
        ("GET", LIVE, "application/grpc", "405", StatusCode.UNIMPLEMENTED),
        ("POST", LIVE, "application/json", "415", StatusCode.INTERNAL),
        ("POST", LIVE, "application/grpc-web", "415", StatusCode.INTERNAL),
    ],
)
async def test_what_cannot_be_a_call_is_answered_trailers_only(
    server: Server, method: str, path: str, content_type: str, http_status: str, code: StatusCode
) -> None:
    client = await server.connect()
    stream = await client.call(path, b"", method=method, content_type=content_type)
    assert stream.headers[":status"] == http_status
    assert stream.status == code
    assert stream.trailers is None and not stream.data  # one header block ends the stream
    await assert_serves(client)


async def test_grpc_content_subtypes_are_calls(server: Server) -> None:
    client = await server.connect()
    stream = await client.call(LIVE, b"", content_type="application/grpc+proto")
    assert stream.status == StatusCode.OK


REQUEST_HEAD = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", LIVE),
    (":authority", "test"),
    ("content-type", "application/grpc"),
]


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param([h for h in REQUEST_HEAD if h[0] != ":path"], id="no-path"),
        pytest.param([h for h in REQUEST_HEAD if h[0] != ":method"], id="no-method"),
        pytest.param([h for h in REQUEST_HEAD if h[0] != ":scheme"], id="no-scheme"),
        pytest.param([*REQUEST_HEAD[:2], ("x-early", "1"), *REQUEST_HEAD[2:]], id="pseudo-after-regular"),
        pytest.param([*REQUEST_HEAD, ("Content-Length", "5")], id="uppercase-name"),
        pytest.param([*REQUEST_HEAD, ("connection", "keep-alive")], id="connection-header"),
        pytest.param([*REQUEST_HEAD, ("grpc-timeout", "soon")], id="bad-grpc-timeout"),
    ],
)
async def test_a_malformed_request_head_resets_only_its_stream(
    server: Server, headers: list[tuple[str, str]]
) -> None:
    client = await server.connect()
    stream_id = client.start(LIVE, headers=headers, end_stream=True)
    assert (await client.response(stream_id)).reset == ErrorCodes.PROTOCOL_ERROR
    await assert_serves(client)  # the HPACK state stayed in step


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        pytest.param(framed(b"\xff\xff\xff\xff"), StatusCode.INVALID_ARGUMENT, id="not-protobuf"),
        pytest.param(b"", StatusCode.INVALID_ARGUMENT, id="no-message"),
        pytest.param(framed(b"") * 2, StatusCode.INVALID_ARGUMENT, id="two-messages"),
        pytest.param(framed(b"\x08\x01")[:-1], StatusCode.INTERNAL, id="ends-inside-a-message"),
        pytest.param(b"\x00\x00\x00", StatusCode.INTERNAL, id="ends-inside-a-prefix"),
    ],
)
async def test_a_unary_call_needs_exactly_one_whole_valid_message(
    server: Server, wire: bytes, code: StatusCode
) -> None:
    client = await server.connect()
    stream_id = client.start(LIVE)
    client.send(stream_id, wire, end_stream=True, size=2)
    stream = await client.response(stream_id)
    assert stream.status == code, stream.message
    await assert_serves(client)


async def test_data_after_the_end_of_the_request_resets_the_stream(server: Server) -> None:
    client = await server.connect()
    stream_id = client.start(INFER)
    client.send(stream_id, framed(infer_request("held", b"x")), end_stream=True)
    client.raw(raw_frame(DATA, 0, stream_id, framed(b"more")))  # h2 would not send it
    assert (await client.response(stream_id)).reset == ErrorCodes.STREAM_CLOSED
    # Reset before its turn after the reads (read together), the call never reached the model.
    assert len(server.held.pending) <= 1
    assert all(pending.cancelled() for pending, _ in server.held.pending)
    await assert_serves(client)


async def test_request_trailers_that_do_not_end_the_stream_reset_it(server: Server) -> None:
    client = await server.connect()
    stream_id = client.start(INFER)
    client.send(stream_id, framed(infer_request("held", b"x")))
    block = client.conn.encoder.encode([("x-trailer", "1")])  # h2 keeps its encoder in step
    client.raw(raw_frame(HEADERS, END_HEADERS, stream_id, block))
    assert (await client.response(stream_id)).reset == ErrorCodes.PROTOCOL_ERROR
    await assert_serves(client)


# -- cancellation, concurrency, deadlines -------------------------------------------------------
async def test_a_reset_call_is_cancelled_and_the_connection_serves_on(server: Server) -> None:
    client = await server.connect()
    stream_id = client.start(INFER)
    client.send(stream_id, framed(infer_request("held", b"x")), end_stream=True)
    await client.sync()
    [(pending, _)] = server.held.pending
    client.conn.reset_stream(stream_id, ErrorCodes.CANCEL)
    await client.sync()
    assert pending.cancelled()  # the queued work is withdrawn
    assert server.listener.service.exchange.telemetry.live == set()  # its scope released
    await assert_serves(client)


async def test_many_streams_opened_and_reset_at_once_leave_nothing_behind(server: Server) -> None:
    client = await server.connect()
    for _ in range(300):
        stream_id = client.start(INFER)
        client.send(stream_id, framed(infer_request("held", b"x")), end_stream=True)
        client.conn.reset_stream(stream_id)
    client.flush()
    await client.sync()
    # A call whose reset is read with it is never started (grpc/connection.py); the rest reach
    # the model and are withdrawn.
    assert len(server.held.pending) < 300
    assert all(pending.cancelled() for pending, _ in server.held.pending)
    assert server.listener.service.exchange.telemetry.live == set()
    await assert_serves(client)


async def test_a_rapid_reset_flood_is_told_to_calm_down(server: Server) -> None:
    client = await server.connect()
    for _ in range(2500):  # far more than the 2000-reset burst, faster than 1000 a second
        stream_id = client.start(INFER)
        client.conn.reset_stream(stream_id)
    client.flush()
    await client.until(lambda: client.goaway is not None)
    assert client.goaway is not None and client.goaway[0] == ErrorCodes.ENHANCE_YOUR_CALM
    await assert_serves(await server.connect())


async def test_streams_over_the_concurrency_limit_are_refused(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    server = await serve(max_concurrent_streams=2)
    client = await server.connect(ready=False)  # opens streams before it learns the limit
    stream_ids = []
    for _ in range(3):
        stream_ids.append(client.start(INFER))
        client.send(stream_ids[-1], framed(infer_request("held", b"x")), end_stream=True)
    refused = await client.response(stream_ids[2])
    assert refused.reset == ErrorCodes.REFUSED_STREAM
    await client.sync()
    assert len(server.held.pending) == 2
    server.held.release()
    for stream_id in stream_ids[:2]:
        assert echoed(await client.response(stream_id)) == b"x"
    await assert_serves(client)


async def test_a_grpc_timeout_becomes_the_calls_deadline(server: Server) -> None:
    client = await server.connect()
    loop = asyncio.get_running_loop()
    started = loop.time()
    stream = await client.call(INFER, infer_request("held", b"x"), metadata=(("grpc-timeout", "50m"),))
    assert stream.status == StatusCode.DEADLINE_EXCEEDED
    assert 0.05 <= loop.time() - started < 2.0
    [request] = server.held.requests
    assert request.timeout_s is not None and 0 < request.timeout_s <= 0.05  # the model's deadline too
    [(pending, _)] = server.held.pending
    assert pending.cancelled()
    telemetry = server.listener.service.exchange.telemetry
    assert telemetry.live == set()  # the request's scope is finished, as a 504's
    assert telemetry.inflight().get("grpc", 0) == 0
    await assert_serves(client)


async def test_a_streaming_call_past_its_deadline_ends_and_its_handler_stops(server: Server) -> None:
    client = await server.connect()
    request = framed(health_pb2.HealthCheckRequest().SerializeToString())
    stream_id = client.start(WATCH, metadata=(("grpc-timeout", "50m"),))
    client.send(stream_id, request)
    stream = client.streams[stream_id]
    await client.until(lambda: bool(stream.data))
    handler = streaming_handler()
    await client.response(stream_id)
    assert stream.status == StatusCode.DEADLINE_EXCEEDED
    assert len(stream.messages()) == 1  # the status it sent before
    await assert_ends(handler)
    await assert_serves(client)


async def test_a_failed_streaming_call_stops_its_handler(server: Server) -> None:
    client = await server.connect()
    stream_id = client.start(WATCH)
    client.send(stream_id, framed(health_pb2.HealthCheckRequest().SerializeToString()))
    stream = client.streams[stream_id]
    await client.until(lambda: bool(stream.data))
    handler = streaming_handler()
    client.send(stream_id, b"\x00" + (MAX_MESSAGE + 1).to_bytes(4, "big"))
    assert (await client.response(stream_id)).status == StatusCode.RESOURCE_EXHAUSTED
    await assert_ends(handler)
    await assert_serves(client)


async def send_until_blocked(client: Client, stream_id: int, message: bytes, limit: int) -> int:
    """Send ``message`` while the server grants window, up to ``limit`` bytes; returns bytes sent."""
    sent = 0
    while sent < limit:
        if client.conn.local_flow_control_window(stream_id) < len(message):
            await client.sync()  # every window update the server would send has arrived
            if client.conn.local_flow_control_window(stream_id) < len(message):
                break
            continue
        client.send(stream_id, message)
        sent += len(message)
    return sent


async def test_a_handler_that_does_not_read_closes_the_clients_window(server: Server) -> None:
    client = await server.connect()
    stream_id = client.start(WATCH)
    client.send(stream_id, framed(health_pb2.HealthCheckRequest().SerializeToString()))
    await client.until(lambda: bool(client.streams[stream_id].data))  # Watch took its one request
    filler = framed(health_pb2.HealthCheckRequest(service="x" * 60_000).SerializeToString())
    sent = await send_until_blocked(client, stream_id, filler, 24 << 20)
    assert sent < 8 << 20  # about the stream window the server advertised, then no more
    client.conn.reset_stream(stream_id)
    await assert_serves(client)


async def test_answers_the_client_does_not_take_stop_its_requests(server: Server) -> None:
    client = await server.connect(window=0)  # the server may send headers, never DATA
    stream_id = client.start(STREAM_INFER)
    # Refused at once (the id is over 1,024 characters), answered with an error echoing the id.
    request = framed(pb.ModelInferRequest(model_name="echo", id="i" * 16_000).SerializeToString())
    sent = await send_until_blocked(client, stream_id, request, 24 << 20)
    assert sent < 12 << 20
    client.conn.update_settings({INITIAL_WINDOW_SIZE: 1 << 26})
    client.conn.increment_flow_control_window(1 << 26)
    client.send(stream_id, b"", end_stream=True)
    stream = await client.response(stream_id)
    assert stream.status == StatusCode.OK, stream.message
    answers = [pb.ModelStreamInferResponse.FromString(m) for m in stream.messages()]
    assert len(answers) == sent // len(request)  # every request was answered, none lost
    assert all("1024" in answer.error_message for answer in answers)
    await assert_serves(client)


# -- connection-level behaviour -----------------------------------------------------------
async def test_a_ping_is_answered_with_its_payload(server: Server) -> None:
    client = await server.connect()
    client.conn.ping(b"8 bytes!")
    client.flush()
    await client.until(lambda: b"8 bytes!" in client.pings)
    [ack] = [frame for frame in client.frames if frame.kind == PING]
    assert (ack.flags, ack.stream, ack.payload) == (ACK, 0, b"8 bytes!")


async def test_a_ping_flood_without_calls_is_told_to_calm_down(server: Server) -> None:
    client = await server.connect()
    for i in range(5):
        client.conn.ping(bytes((i,)) * 8)
    client.flush()
    await client.until(lambda: client.goaway is not None)
    assert client.goaway is not None and client.goaway[0] == ErrorCodes.ENHANCE_YOUR_CALM
    await client.until(lambda: client.closed)
    await assert_serves(await server.connect())


async def test_pings_between_calls_are_not_a_flood(server: Server) -> None:
    client = await server.connect()
    for round_ in range(4):
        payloads = [bytes((round_, i)) * 4 for i in range(2)]
        for payload in payloads:
            client.conn.ping(payload)
        client.flush()
        await client.until(lambda: all(p in client.pings for p in payloads))  # noqa: B023
        await assert_serves(client)
    assert client.goaway is None


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        pytest.param(
            ((1 << 20) + 1).to_bytes(3, "big") + raw_frame(DATA, 0, 1)[3:],  # the header alone
            ErrorCodes.FRAME_SIZE_ERROR,
            id="frame-over-max-size",
        ),
        pytest.param(raw_frame(DATA, 0, 0, b"x"), ErrorCodes.PROTOCOL_ERROR, id="data-on-stream-0"),
        pytest.param(raw_frame(DATA, 0, 99, b"x"), ErrorCodes.PROTOCOL_ERROR, id="data-on-idle-stream"),
        pytest.param(
            raw_frame(WINDOW_UPDATE, 0, 0, MAX_WINDOW.to_bytes(4, "big")),
            ErrorCodes.FLOW_CONTROL_ERROR,
            id="connection-window-overflow",
        ),
        pytest.param(
            raw_frame(WINDOW_UPDATE, 0, 0, bytes(4)), ErrorCodes.PROTOCOL_ERROR, id="window-update-0"
        ),
        pytest.param(
            raw_frame(WINDOW_UPDATE, 0, 9, b"\0\0\0\1"), ErrorCodes.PROTOCOL_ERROR, id="window-idle"
        ),
        pytest.param(
            raw_frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\xff\x00"),
            ErrorCodes.COMPRESSION_ERROR,
            id="invalid-hpack",
        ),
        pytest.param(
            raw_frame(HEADERS, END_STREAM, 1, b"\x83\x86") + raw_frame(PING, 0, 0, bytes(8)),
            ErrorCodes.PROTOCOL_ERROR,
            id="header-block-interrupted",
        ),
        pytest.param(
            raw_frame(CONTINUATION, END_HEADERS, 1, b"\x83"),
            ErrorCodes.PROTOCOL_ERROR,
            id="stray-continuation",
        ),
        pytest.param(
            raw_frame(HEADERS, END_HEADERS | END_STREAM, 2, b"\x83"),
            ErrorCodes.PROTOCOL_ERROR,
            id="even-stream",
        ),
        pytest.param(raw_frame(PUSH_PROMISE, END_HEADERS, 1, bytes(4)), ErrorCodes.PROTOCOL_ERROR, id="push"),
        pytest.param(
            raw_frame(RST_STREAM, 0, 7, bytes(4)), ErrorCodes.PROTOCOL_ERROR, id="reset-idle-stream"
        ),
        pytest.param(raw_frame(SETTINGS, 0, 0, bytes(5)), ErrorCodes.FRAME_SIZE_ERROR, id="settings-size"),
        pytest.param(raw_frame(SETTINGS, 0, 1, b""), ErrorCodes.PROTOCOL_ERROR, id="settings-on-stream"),
        pytest.param(
            raw_frame(SETTINGS, ACK, 0, bytes(6)), ErrorCodes.FRAME_SIZE_ERROR, id="settings-ack-payload"
        ),
        pytest.param(setting(INITIAL_WINDOW_SIZE, 2**31), ErrorCodes.FLOW_CONTROL_ERROR, id="window-setting"),
        pytest.param(setting(5, 100), ErrorCodes.PROTOCOL_ERROR, id="max-frame-setting"),
        pytest.param(raw_frame(PING, 0, 0, b"short"), ErrorCodes.FRAME_SIZE_ERROR, id="ping-size"),
        pytest.param(raw_frame(PING, 0, 3, bytes(8)), ErrorCodes.PROTOCOL_ERROR, id="ping-on-stream"),
        pytest.param(raw_frame(GOAWAY, 0, 0, bytes(3)), ErrorCodes.FRAME_SIZE_ERROR, id="goaway-size"),
        pytest.param(raw_frame(PRIORITY, 0, 0, bytes(5)), ErrorCodes.PROTOCOL_ERROR, id="priority-stream-0"),
    ],
)
async def test_a_connection_error_ends_in_goaway_and_the_server_serves_on(
    server: Server, frames: bytes, code: ErrorCodes
) -> None:
    client = await server.connect()
    client.raw(frames)
    await client.until(lambda: client.goaway is not None)
    assert client.goaway is not None and client.goaway[0] == code
    await client.until(lambda: client.closed)
    await assert_serves(await server.connect())


async def test_an_http1_request_is_not_served(server: Server) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
    data = await asyncio.wait_for(reader.read(), 5)  # everything, up to the server's close
    writer.close()
    await writer.wait_closed()
    frames, rest = split_frames(data)
    last = parse(frames[-1])
    assert not rest and last.kind == GOAWAY
    assert int.from_bytes(last.payload[4:8], "big") == ErrorCodes.PROTOCOL_ERROR
    await assert_serves(await server.connect())


async def test_unknown_frame_types_and_priority_frames_are_ignored(server: Server) -> None:
    client = await server.connect()
    client.raw(raw_frame(0xFA, 0xFF, 0, b"extension") + raw_frame(PRIORITY, 0, 11, bytes(5)))
    await assert_serves(client)


# -- drain and keepalive -------------------------------------------------------------------
async def test_drain_finishes_calls_in_flight_refuses_new_ones_then_closes(server: Server) -> None:
    client = await server.connect()
    stream_id = client.start(INFER)
    client.send(stream_id, framed(infer_request("held", b"in flight")), end_stream=True)
    await client.sync()
    server.listener.stop_accepting(5.0)
    await client.until(lambda: client.goaway is not None)
    assert client.goaway == (ErrorCodes.NO_ERROR, stream_id)
    late = client.start(LIVE)  # h2 never saw the GOAWAY, so it still opens streams
    client.send(late, framed(b""), end_stream=True)
    assert (await client.response(late)).reset == ErrorCodes.REFUSED_STREAM
    server.held.release()
    assert echoed(await client.response(stream_id)) == b"in flight"
    await client.until(lambda: client.closed)
    await asyncio.wait_for(server.listener.wait_closed(), 5)


async def test_an_idle_peer_that_does_not_answer_keepalive_pings_is_dropped(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    server = await serve(keepalive_time_s=0.1, keepalive_timeout_s=0.1)
    client = await server.connect()
    client.answering = False  # reads, never writes: the server's pings go unanswered
    loop = asyncio.get_running_loop()
    started = loop.time()
    await client.until(lambda: client.closed)
    assert loop.time() - started < 2.0  # a keepalive period and a timeout, not the preface deadline
    assert [frame.flags for frame in client.frames if frame.kind == PING] == [0]
    assert client.goaway is not None


async def test_a_peer_that_answers_keepalive_pings_stays_connected(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    server = await serve(keepalive_time_s=0.05, keepalive_timeout_s=0.5)
    client = await server.connect()
    await client.until(lambda: len([f for f in client.frames if f.kind == PING]) >= 3)
    assert client.goaway is None
    await assert_serves(client)
