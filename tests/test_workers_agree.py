"""With ``--workers 2`` a control call is applied on every worker or on none: a worker killed
while a load is under way converges to the recorded state when it comes back."""

from __future__ import annotations

import http.client
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from model_builders import write_scaled_version
from ortserve.testing import ServerProcess, run_server
from workers_helpers import scrape, value, wait_until, worker_pids


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[ServerProcess]:
    write_scaled_version(tmp_path / "models", "m", 1, 1.0)
    args = [
        "--workers",
        "2",
        "--model-control-mode",
        "explicit",
        "--load-model",
        "m",
        "--intra-op-threads",
        "1",
    ]
    with run_server(tmp_path / "models", tmp_path / "server.log", args) as server:
        yield server


def _post(server: ServerProcess, path: str, body: object) -> tuple[int, bytes]:
    # The workers share the port (SO_REUSEPORT): a connection the kernel queued on the worker
    # just killed is reset before any byte is read, and a client tries again, as this does.
    for attempt in range(3):
        connection = http.client.HTTPConnection(server.host, server.http_port, timeout=120)
        try:
            connection.request("POST", path, json.dumps(body), {"Connection": "close"})
            reply = connection.getresponse()
            return reply.status, reply.read()
        except ConnectionResetError:
            if attempt == 2:
                raise
        finally:
            connection.close()
    raise AssertionError("unreachable")


def _load(server: ServerProcess, max_batch_size: int) -> int:
    config = json.dumps({"max_batch_size": max_batch_size})
    return _post(server, "/v2/repository/models/m/load", {"parameters": {"config": config}})[0]


def _max_batch_size(server: ServerProcess) -> int:
    """On a new connection: SO_REUSEPORT may hand it to either worker."""
    connection = http.client.HTTPConnection(server.host, server.http_port, timeout=30)
    try:
        connection.request("GET", "/v2/models/m/config", headers={"Connection": "close"})
        return int(json.loads(connection.getresponse().read())["max_batch_size"])
    finally:
        connection.close()


def _converged(server: ServerProcess) -> bool:
    """The index says READY with no reason only when every worker applied every call."""
    status, body = _post(server, "/v2/repository/index", {})
    rows = [(r["name"], r["state"], r["reason"]) for r in json.loads(body)]
    return status == 200 and rows == [("m", "READY", "")]


def test_a_worker_killed_during_a_load_converges_to_the_recorded_config(workers: ServerProcess) -> None:
    """SIGKILL one worker and at once load a new config: the survivor applied it, the answer
    was 503, and after the restart the workers served max_batch_size 8 and 4 while the index
    said READY."""
    assert _load(workers, 8) == 200
    pids = worker_pids(scrape(workers))
    os.kill(int(pids["0"]), signal.SIGKILL)
    status = _load(workers, 4)
    assert status == 200  # applied where it could be; the killed worker replays it
    wait_until(
        lambda: (
            value(scrape(workers), "ortserve_worker_restarts_total", worker="0") == 1
            and value(scrape(workers), "ortserve_workers_up") == 2
        ),
        what="worker 0 restarted",
    )
    wait_until(lambda: _converged(workers), what="the index converged")
    assert {_max_batch_size(workers) for _ in range(30)} == {4}
