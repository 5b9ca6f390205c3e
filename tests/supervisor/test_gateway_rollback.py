"""With ``--workers N`` a control call is applied on every worker or on none: when one worker
refuses a load the others took, they are rolled back to the recorded state, and until every
worker is back the index says so.

The gateway, its ledger and the Unix-socket channel are the supervisor's own; the workers are
small HTTP servers on the workers' private sockets that keep the last call applied per model
and refuse what a test tells them to (the injected failure), so every refusal is exact.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ortserve.server.http.messages import HttpRequest, resolve_response
from ortserve.settings import ServerSettings
from ortserve.supervisor.gateway import Gateway
from ortserve.supervisor.plan import WorkerLaunch
from ortserve.supervisor.slots import WorkerSlot
from ortserve.supervisor.spawner import Spawner

LOAD = "/v2/repository/models/m/load"
UNLOAD = "/v2/repository/models/m/unload"


def _body(max_batch_size: int) -> bytes:
    return json.dumps({"parameters": {"config": json.dumps({"max_batch_size": max_batch_size})}}).encode()


A, B = _body(8), _body(4)
FILES = b""  # a load with no configuration: the model's own files


@dataclass
class Worker:
    """A worker's private socket: applies loads and unloads of ``m``, unless ``refuse`` says
    otherwise (a status), or ``vanish`` says to apply it and drop the connection unanswered."""

    index: int
    state: bytes | None = FILES
    """The body of the last load applied (FILES: loaded from its files), None: unloaded."""
    refuse: Callable[[str, bytes], int | None] = lambda path, body: None
    vanish: Callable[[str, bytes], bool] = lambda path, body: False
    calls: list[tuple[str, bytes]] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        method_path = head.split(b"\r\n", 1)[0].split(b" ")
        path = method_path[1].decode()
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        body = await reader.readexactly(length)
        status, answer = self.answer(path, body)
        if status == 0:
            writer.close()
            return
        writer.write(
            b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (status, len(answer), answer)
        )
        await writer.drain()
        writer.close()

    def answer(self, path: str, body: bytes) -> tuple[int, bytes]:
        if path == "/v2/repository/index":
            rows = (
                [] if self.state is None else [{"name": "m", "version": "1", "state": "READY", "reason": ""}]
            )
            return 200, json.dumps(rows).encode()
        self.calls.append((path, body))
        refused = self.refuse(path, body)
        if refused is not None:
            return refused, json.dumps({"error": f"worker {self.index} refuses"}).encode()
        self.state = None if path == UNLOAD else body
        return (0, b"") if self.vanish(path, body) else (200, b"{}")


@dataclass
class Cluster:
    gateway: Gateway
    workers: list[Worker]

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        answer = await resolve_response(self.gateway.private(HttpRequest("POST", path, "", {}, body)))
        return answer.status, b"".join(bytes(chunk) for chunk in answer.chunks)

    async def index(self) -> list[tuple[str, str, str]]:
        status, body = await self.post("/v2/repository/index", b"{}")
        assert status == 200
        return [(row["name"], row["state"], row["reason"]) for row in json.loads(body)]


async def _cluster(tmp_path: Path, workers: int, load_models: tuple[str, ...]) -> AsyncIterator[Cluster]:
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True)
    settings = ServerSettings(tmp_path, model_control_mode="explicit", load_models=load_models)
    launch = WorkerLaunch(settings, run_dir, "token")
    fakes = [Worker(i, FILES if load_models else None) for i in range(workers)]
    servers = [await asyncio.start_unix_server(w.serve, str(launch.worker_socket(w.index))) for w in fakes]
    slots = [WorkerSlot(i, Spawner(run_dir)) for i in range(workers)]
    try:
        yield Cluster(Gateway(launch, slots), fakes)
    finally:
        for server in servers:
            server.close()
            await server.wait_closed()


@pytest.fixture
async def three(tmp_path: Path) -> AsyncIterator[Cluster]:
    async for cluster in _cluster(tmp_path, 3, ("m",)):
        yield cluster


CONVERGED = [("m", "READY", "")]


async def test_a_load_one_worker_refuses_is_rolled_back_on_the_others(three: Cluster) -> None:
    assert (await three.post(LOAD, A))[0] == 200
    three.workers[1].refuse = lambda path, body: 400 if body == B else None
    status, answer = await three.post(LOAD, B)
    assert status == 400 and b"worker 1 refuses" in answer
    assert [w.state for w in three.workers] == [A, A, A]
    assert three.workers[0].calls[-2:] == [(LOAD, B), (LOAD, A)]  # took it, then rolled back
    assert three.gateway._ledger.generation == 1  # nothing recorded for the refused call
    assert await three.index() == CONVERGED


async def test_with_nothing_recorded_the_rollback_restores_the_state_at_start(tmp_path: Path) -> None:
    async for loaded in _cluster(tmp_path / "loaded", 2, ("m",)):
        loaded.workers[1].refuse = lambda path, body: 500
        assert (await loaded.post(LOAD, B))[0] == 500
        assert [w.state for w in loaded.workers] == [FILES, FILES]  # as --load-model m had it
    async for unloaded in _cluster(tmp_path / "unloaded", 2, ()):
        unloaded.workers[0].refuse = lambda path, body: 400
        assert (await unloaded.post(LOAD, B))[0] == 400
        assert [w.state for w in unloaded.workers] == [None, None]  # it was never loaded
        assert unloaded.workers[1].calls == [(LOAD, B), (UNLOAD, b"")]


async def test_a_worker_whose_rollback_fails_is_reported_until_it_is_back(three: Cluster) -> None:
    """Rolling back is a control call too, and can fail: the worker then serves the refused
    configuration, and the index must not say READY until it is restored."""
    assert (await three.post(LOAD, A))[0] == 200
    broken = True
    three.workers[0].refuse = lambda path, body: 503 if broken and body == A else None
    three.workers[2].refuse = lambda path, body: 400 if body == B else None
    assert (await three.post(LOAD, B))[0] == 400
    assert [w.state for w in three.workers] == [B, A, A]
    [(name, state, reason)] = await three.index()  # tries again first: still refused
    assert (name, state) == ("m", "UNAVAILABLE") and "worker 0" in reason and "converging" in reason
    broken = False
    assert await three.index() == CONVERGED
    assert [w.state for w in three.workers] == [A, A, A]


async def test_a_worker_that_took_a_refused_call_unanswered_is_rolled_back(three: Cluster) -> None:
    """A worker that applied the call but whose answer was lost (killed after applying, or a
    dropped connection) took it as much as one that answered 200."""
    assert (await three.post(LOAD, A))[0] == 200
    three.workers[0].vanish = lambda path, body: body == B
    three.workers[1].refuse = lambda path, body: 400 if body == B else None
    assert (await three.post(LOAD, B))[0] == 400
    assert await three.index() == CONVERGED
    assert [w.state for w in three.workers] == [A, A, A]


async def test_a_later_call_recorded_everywhere_settles_a_divergence(three: Cluster) -> None:
    assert (await three.post(LOAD, A))[0] == 200
    three.workers[0].refuse = lambda path, body: 503 if body == A else None
    three.workers[1].refuse = lambda path, body: 400 if body == B else None
    assert (await three.post(LOAD, B))[0] == 400
    assert [w.state for w in three.workers] == [B, A, A]
    three.workers[1].refuse = lambda path, body: None
    C = _body(2)
    assert (await three.post(LOAD, C))[0] == 200
    assert [w.state for w in three.workers] == [C, C, C]
    assert await three.index() == CONVERGED
