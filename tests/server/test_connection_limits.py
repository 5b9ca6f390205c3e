"""Connections and memory bounded: the connection cap, header/body/idle deadlines, bodies freed
without a GC pass, and the server-wide byte budget, on a real HTTP listener in process."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import resource
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from ortserve.cli.main import main
from ortserve.metrics import ServerMetrics
from ortserve.server.connections import ByteBudget, ConnectionLimit, ConnectionSet, connection_cap
from ortserve.server.grpc.options import GrpcOptions
from ortserve.server.http import listener as http_listener_module
from ortserve.server.http.connection import ConnectionLimits, HttpConnection
from ortserve.server.http.listener import HttpListener
from ortserve.server.http.messages import HttpRequest, HttpResponse, json_response
from ortserve.server.http.responder import Handler
from ortserve.server.metrics_listener import MetricsListener
from ortserve.settings import ServerSettings
from waiting import until

FAST = ConnectionLimits(max_body_bytes=16 << 20, keepalive_timeout_s=0.3, header_timeout_s=0.3)
SLOW = ConnectionLimits(max_body_bytes=16 << 20, keepalive_timeout_s=30.0, header_timeout_s=30.0)


def answer_size(request: HttpRequest) -> HttpResponse:
    return json_response(200, b'{"size":%d}' % len(request.body))


@dataclass
class HeldAnswers:
    """A handler whose answers wait until the test releases them."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    arrived: int = 0

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        self.arrived += 1
        await self.release.wait()
        return answer_size(request)


@dataclass
class Site:
    """A listening port and the client connections a test opened to it (closed at the end)."""

    port: int
    clients: list[asyncio.StreamWriter] = field(default_factory=list)

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.clients.append(writer)
        return reader, writer


@contextlib.asynccontextmanager
async def serving(
    handler: Handler,
    limits: ConnectionLimits = SLOW,
    cap: ConnectionLimit | None = None,
    budget: ByteBudget | None = None,
) -> AsyncIterator[Site]:
    listener = HttpListener(handler, limits, cap, budget)
    site = Site(await listener.start("127.0.0.1", 0))
    try:
        yield site
    finally:
        for writer in site.clients:
            writer.transport.abort()
        listener.stop_accepting()
        await listener.wait_closed(0.5)


def post_head(size: int, path: bytes = b"/infer") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (path, size)


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.split(b"\r\n")
    headers = dict(line.lower().split(b": ", 1) for line in lines[1:] if line)
    body = await asyncio.wait_for(reader.readexactly(int(headers[b"content-length"])), 5)
    return int(lines[0].split()[1]), headers, body


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True once the server closes (EOF or reset) within 5 s."""
    try:
        return await asyncio.wait_for(reader.read(), 5) is not None
    except ConnectionResetError:
        return True


# -- the cap itself ----------------------------------------------------------------------


@dataclass(eq=False)
class FakeConnection:
    members: ConnectionSet[FakeConnection]
    evicted: bool = False
    received: int = 0

    def evict(self) -> None:
        self.evicted = True
        self.members.discard(self)


def joined(members: ConnectionSet[FakeConnection]) -> FakeConnection | None:
    if not members.limit.admit():
        return None
    connection = FakeConnection(members)
    members.connections.add(connection)
    return connection


def test_at_the_cap_the_longest_idle_connection_makes_room() -> None:
    members: ConnectionSet[FakeConnection] = ConnectionSet(ConnectionLimit(2))
    first, second = joined(members), joined(members)
    assert first is not None and second is not None
    members.limit.idle(first)
    members.limit.idle(second)
    members.limit.busy(first)
    members.limit.idle(first)  # first became idle again after second did: second is older
    third = joined(members)
    assert third is not None and second.evicted and not first.evicted
    assert members.limit.open == 2 and members.limit.evicted == 1


def test_with_no_idle_connection_a_new_one_is_refused_until_one_leaves() -> None:
    members: ConnectionSet[FakeConnection] = ConnectionSet(ConnectionLimit(1))
    only = joined(members)
    assert only is not None
    assert joined(members) is None and members.limit.refused == 1
    members.discard(only)
    members.discard(only)  # a second close gives nothing back twice
    assert members.limit.open == 0
    assert joined(members) is not None


def test_the_cap_is_lowered_to_what_the_open_file_limit_allows(caplog: pytest.LogCaptureFixture) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1000, hard))
    try:
        with caplog.at_level(logging.WARNING):
            assert connection_cap(10_000) == 872
        assert connection_cap(500) == 500
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert "raise ulimit -n" in caplog.text


def test_the_request_deadline_and_per_peer_flags_reach_both_transports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ortserve.server.lifecycle

    seen: list[ServerSettings] = []

    async def capture(settings: ServerSettings) -> None:
        seen.append(settings)

    monkeypatch.setattr(ortserve.server.lifecycle, "serve", capture)
    monkeypatch.setenv("ORTSERVE_MAX_CONNECTIONS_PER_PEER", "7")
    args = ["serve", "--model-repository", str(tmp_path), "--request-timeout", "30"]
    result = CliRunner().invoke(main, [*args, "--request-min-rate", "2000"])
    assert result.exit_code == 0, result.output
    (settings,) = seen
    assert (settings.request_timeout_s, settings.request_min_rate) == (30.0, 2000.0)
    assert settings.max_connections_per_peer == 7
    engine = GrpcOptions.from_settings(settings).engine()
    assert (engine.request_timeout_s, engine.request_min_rate) == (30.0, 2000.0)
    assert engine.request_grace_s == settings.header_timeout_s


def test_the_byte_budget_must_leave_room_for_a_body_being_joined(tmp_path: Path) -> None:
    args = ["serve", "--model-repository", str(tmp_path), "--max-body-bytes", "1000"]
    result = CliRunner().invoke(main, [*args, "--max-inflight-bytes", "1999"])
    assert result.exit_code == 2 and "at least twice --max-body-bytes" in result.output


async def test_over_the_cap_a_probe_is_answered_and_anything_else_gets_503_and_close() -> None:
    """Every place serves a whole request (none can make room): a new connection still gets
    one of the places kept for health probes, answered once, then closed."""
    held, cap = HeldAnswers(), ConnectionLimit(2)
    async with serving(held, cap=cap) as site:
        busy = [await site.connect() for _ in range(2)]
        for _, writer in busy:
            writer.write(post_head(3) + b"abc")
        await until(lambda: held.arrived == 2)
        reader, writer = await site.connect()
        writer.write(post_head(3) + b"abc")
        status, headers, body = await read_response(reader)
        assert status == 503 and headers[b"connection"] == b"close" and headers[b"retry-after"] == b"1"
        assert b"too many connections" in body and await closed_by_server(reader)
        reader, writer = await site.connect()
        writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        await until(lambda: held.arrived == 3)  # the probe reached the handler
        held.release.set()
        status, headers, _ = await read_response(reader)
        assert status == 200 and headers[b"connection"] == b"close" and await closed_by_server(reader)
        for reader, _ in busy:
            assert (await read_response(reader))[0] == 200


async def test_with_no_probe_place_left_a_connection_over_the_cap_gets_503_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http_listener_module, "PROBE_PLACES", 0)
    held, cap = HeldAnswers(), ConnectionLimit(2)
    async with serving(held, cap=cap) as site:
        busy = [await site.connect() for _ in range(2)]
        for _, writer in busy:
            writer.write(post_head(3) + b"abc")
        await until(lambda: held.arrived == 2)
        reader, writer = await site.connect()
        status, headers, body = await read_response(reader)
        assert status == 503 and headers[b"connection"] == b"close" and headers[b"retry-after"] == b"1"
        assert b"too many connections" in body and await closed_by_server(reader)
        assert cap.lingering == 1  # half-closed, waiting for the client to hang up
        writer.close()
        await until(lambda: cap.lingering == 0)
        cap.lingering = 10**6  # as if a flood of refusals lingered: the next one closes at once
        reader, _ = await site.connect()
        assert (await read_response(reader))[0] == 503 and await closed_by_server(reader)
        assert cap.lingering == 10**6
        cap.lingering = 0
        held.release.set()
        for reader, _ in busy:
            assert (await read_response(reader))[0] == 200


async def test_silent_connections_at_the_cap_are_evicted_for_a_real_client() -> None:
    async with serving(answer_size, cap=ConnectionLimit(3)) as site:
        silent = [await site.connect() for _ in range(3)]
        reader, writer = await site.connect()
        writer.write(post_head(2) + b"ok")
        assert (await read_response(reader))[0] == 200
        assert await closed_by_server(silent[0][0])


# -- deadlines ---------------------------------------------------------------------------


async def test_a_slowloris_request_head_gets_408_after_the_header_timeout() -> None:
    async with serving(answer_size, FAST) as site:
        reader, writer = await site.connect()
        writer.write(b"POST /infer HTTP/1.1\r\nHost: x\r\n")
        for _ in range(3):  # still trickling header lines: that does not extend the deadline
            await asyncio.sleep(0.1)  # real pacing against the server's real header timeout
            writer.write(b"X-Slow: 1\r\n")
        status, headers, _ = await read_response(reader)
        assert status == 408 and headers[b"connection"] == b"close"
        assert await closed_by_server(reader)


async def test_a_trickled_body_gets_408() -> None:
    async with serving(answer_size, FAST) as site:
        reader, writer = await site.connect()
        writer.write(post_head(1000))
        status, _, _ = await read_response(reader)  # 300 ms + 1 byte / 500 B/s, nothing sent
        assert status == 408


async def test_a_connection_that_never_sends_is_closed_after_the_header_timeout() -> None:
    async with serving(answer_size, FAST) as site:
        reader, _ = await site.connect()
        assert await reader.read() == b""


async def test_an_idle_keep_alive_connection_closes_after_the_keepalive_timeout() -> None:
    limits = ConnectionLimits(keepalive_timeout_s=0.2, header_timeout_s=30.0)
    async with serving(answer_size, limits) as site:
        reader, writer = await site.connect()
        writer.write(post_head(2) + b"ok")
        assert (await read_response(reader))[0] == 200
        assert await reader.read() == b""


async def test_a_slow_handler_is_not_timed_out() -> None:
    held = HeldAnswers()
    async with serving(held, FAST) as site:
        reader, writer = await site.connect()
        writer.write(post_head(2) + b"ok")
        await until(lambda: held.arrived == 1, 5, "the request at the handler")
        # A connection opened now that never sends is closed at the header timeout, which is
        # also the keep-alive one: by then either would have fired for the held request too.
        witness, _ = await site.connect()
        assert await closed_by_server(witness)
        held.release.set()
        assert (await read_response(reader))[0] == 200


async def test_a_long_answer_does_not_wake_its_connections_timer_every_millisecond(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While we answer there is no deadline: once the request's arrival stamp has passed, the
    timer must still tick at the timeouts' pace (0.1 s here), not re-arm for a millisecond."""
    ticks: list[float] = []
    on_timer = HttpConnection._on_timer

    def counted(connection: HttpConnection) -> None:
        ticks.append(asyncio.get_running_loop().time())
        on_timer(connection)

    monkeypatch.setattr(HttpConnection, "_on_timer", counted)
    held = HeldAnswers()
    limits = ConnectionLimits(max_body_bytes=16 << 20, keepalive_timeout_s=0.1, header_timeout_s=0.1)
    async with serving(held, limits) as site:
        reader, writer = await site.connect()
        writer.write(post_head(2) + b"ok")
        await until(lambda: held.arrived == 1, 5, "the request at the handler")
        # Six wake-ups while the answer is held: past the arrival stamp, whatever their pace.
        await until(lambda: len(ticks) >= 6, 5, "the held connection's timer")
        held.release.set()
        assert (await read_response(reader))[0] == 200
    gaps = [later - earlier for earlier, later in itertools.pairwise(ticks[:6])]
    assert min(gaps) >= 0.05, f"timer wake-ups {gaps} s apart for one held answer"


# -- memory ------------------------------------------------------------------------------


@contextlib.contextmanager
def no_gc_and_traced() -> Iterator[None]:
    """Bodies must be freed by reference counting alone: the cyclic collector is off."""
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()
        gc.enable()


def traced() -> int:
    return tracemalloc.get_traced_memory()[0]


BODY = 4 << 20


async def send_in_pieces(writer: asyncio.StreamWriter, size: int) -> None:
    for _ in range(size // 65536):
        writer.write(b"x" * 65536)
        await writer.drain()


async def test_an_answered_body_is_freed_while_its_connection_stays_open() -> None:
    async with serving(answer_size) as site:
        reader, writer = await site.connect()
        with no_gc_and_traced():
            before = traced()
            writer.write(post_head(BODY))
            await send_in_pieces(writer, BODY)
            assert (await read_response(reader))[1:] and traced() - before < BODY // 4
        writer.close()


async def test_a_body_abandoned_mid_upload_is_freed_when_the_connection_drops() -> None:
    async with serving(answer_size) as site:
        with no_gc_and_traced():
            before = traced()
            _, writer = await site.connect()
            writer.write(post_head(BODY))
            await send_in_pieces(writer, BODY // 2)
            await until(lambda: traced() - before > BODY // 3)  # the server holds the half body
            writer.transport.abort()
            await until(lambda: traced() - before < BODY // 8)


# -- the byte budget ---------------------------------------------------------------------


async def test_past_the_byte_budget_requests_get_429_and_the_server_serves_on() -> None:
    held, budget = HeldAnswers(), ByteBudget(1 << 20)
    async with serving(held, budget=budget) as site:
        first = await site.connect()
        first[1].write(post_head(700_000) + b"a" * 700_000)
        await until(lambda: held.arrived == 1)
        assert budget.held == 700_000
        declared = await site.connect()
        declared[1].write(post_head(400_000))  # refused from its Content-Length, body unread
        status, headers, _ = await read_response(declared[0])
        assert status == 429 and headers[b"retry-after"] == b"1"
        chunked = await site.connect()
        chunked[1].write(b"POST /infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunked[1].write(b"61a80\r\n" + b"c" * 400_000 + b"\r\n")  # counted as it arrives
        assert (await read_response(chunked[0]))[0] == 429
        held.release.set()
        assert (await read_response(first[0]))[2] == b'{"size":700000}'
        await until(lambda: budget.held == 0)
        again = await site.connect()
        again[1].write(post_head(900_000) + b"b" * 900_000)
        assert (await read_response(again[0]))[2] == b'{"size":900000}'


async def test_bytes_of_a_dropped_connection_go_back_to_the_budget() -> None:
    held, budget = HeldAnswers(), ByteBudget(1 << 20)
    async with serving(held, budget=budget) as site:
        _, writer = await site.connect()
        writer.write(post_head(500_000) + b"a" * 250_000)
        await until(lambda: budget.held == 250_000)
        writer.transport.abort()
        await until(lambda: budget.held == 0)
        _, writer = await site.connect()
        writer.write(post_head(500_000) + b"a" * 500_000)
        await until(lambda: held.arrived == 1)
        writer.transport.abort()
        await until(lambda: budget.held == 0)


async def test_the_metrics_port_has_a_cap_of_its_own() -> None:
    metrics = MetricsListener(ServerMetrics(lambda: [], lambda: {"http": 0, "grpc": 0}))
    site = Site(await metrics.start("127.0.0.1", 0))
    try:
        stalled = []
        for _ in range(64):  # bodies under way that stopped: the cap may close them for others
            reader, writer = await site.connect()
            writer.write(b"POST /metrics HTTP/1.1\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n")
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100")
            stalled.append(reader)
        reader, writer = await site.connect()
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await read_response(reader))[0] == 200
        assert await closed_by_server(stalled[0])  # the 65th took the oldest stalled one's place
    finally:
        for writer in site.clients:
            writer.transport.abort()
        await metrics.stop(0.5)
