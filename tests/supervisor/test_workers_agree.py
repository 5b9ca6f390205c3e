"""With ``--workers 2`` a control call is applied on every worker or on none: a worker killed
while a load is under way converges to the recorded state when it comes back, and a load one
worker refuses is rolled back on the other (the refusal injected on that worker's private
socket, between the supervisor and the real worker)."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import socketserver
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from model_builders import write_scaled_version
from ortserve.testing import ServerProcess, run_server
from workers_helpers import scrape, value, wait_until, worker_pids


@pytest.fixture
def run_root() -> Iterator[Path]:
    """Where the supervisor makes its private run folder (TMPDIR): a short path, since the
    workers' Unix sockets live there (108 bytes at most)."""
    root = Path(tempfile.mkdtemp(prefix="ow-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def workers(tmp_path: Path, run_root: Path) -> Iterator[ServerProcess]:
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
    with run_server(tmp_path / "models", tmp_path / "server.log", args, {"TMPDIR": str(run_root)}) as server:
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


class RefusingSocket(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """Stands at a worker's private socket (the real one moved aside): passes the supervisor's
    requests on to the worker, except those ``refuse`` picks, answered 400 here."""

    daemon_threads = True

    def __init__(self, path: Path, refuse: Callable[[bytes], bool]) -> None:
        self.real = path.with_name(path.name + ".real")
        path.rename(self.real)
        self.refuse = refuse
        self.refused: list[bytes] = []
        super().__init__(str(path), _Relay)
        threading.Thread(target=self.serve_forever, daemon=True).start()


class _Relay(socketserver.StreamRequestHandler):
    server: RefusingSocket

    def handle(self) -> None:
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += self.rfile.read(1)
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        body = self.rfile.read(length)
        if self.server.refuse(body):
            self.server.refused.append(body)
            answer = b'{"error":"refused by the test"}'
            self.wfile.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n")
            self.wfile.write(b"content-length: %d\r\n\r\n%s" % (len(answer), answer))
            return
        with socket.socket(socket.AF_UNIX) as real:
            real.connect(str(self.server.real))
            real.sendall(head + body)
            while chunk := real.recv(65536):
                self.wfile.write(chunk)


def _worker_socket(run_root: Path, index: int) -> Path:
    [run_dir] = run_root.glob("ortserve-workers-*")
    return run_dir / f"worker-{index}.sock"


def _config_of(max_batch_size: int) -> Callable[[bytes], bool]:
    return lambda body: (
        json.dumps({"max_batch_size": max_batch_size})
        in json.loads(body or b"{}").get("parameters", {}).get("config", "")
    )


def test_a_load_one_worker_refuses_is_rolled_back_on_the_other(
    workers: ServerProcess, run_root: Path
) -> None:
    """Worker 1 refuses max_batch_size 4; worker 0 applied it and is put back to 8, the
    recorded config, and the index is READY once both serve 8 again."""
    assert _load(workers, 8) == 200
    proxy = RefusingSocket(_worker_socket(run_root, 1), _config_of(4))
    try:
        status, answer = _post(
            workers,
            "/v2/repository/models/m/load",
            {"parameters": {"config": json.dumps({"max_batch_size": 4})}},
        )
        assert status == 400 and b"refused by the test" in answer and len(proxy.refused) == 1
        assert {_max_batch_size(workers) for _ in range(30)} == {8}
        assert _converged(workers)
    finally:
        proxy.shutdown()
        proxy.server_close()


def test_a_worker_whose_rollback_fails_is_reported_until_it_is_restored(
    workers: ServerProcess, run_root: Path
) -> None:
    """Worker 1 refuses max_batch_size 4 and worker 0 refuses to be put back to 8 (injected):
    worker 0 serves 4, worker 1 serves 8, and the index must not say READY; once worker 0
    accepts again the next index call restores it."""
    assert _load(workers, 8) == 200
    broken = threading.Event()
    broken.set()
    restore = _config_of(8)
    zero = RefusingSocket(_worker_socket(run_root, 0), lambda body: broken.is_set() and restore(body))
    one = RefusingSocket(_worker_socket(run_root, 1), _config_of(4))
    try:
        assert _load(workers, 4) == 400
        assert zero.refused and {_max_batch_size(workers) for _ in range(40)} == {4, 8}
        status, body = _post(workers, "/v2/repository/index", {})
        [row] = json.loads(body)
        assert status == 200 and row["state"] == "UNAVAILABLE" and "worker 0" in row["reason"]
        broken.clear()
        assert _converged(workers)
        assert {_max_batch_size(workers) for _ in range(30)} == {8}
    finally:
        for proxy in (zero, one):
            proxy.shutdown()
            proxy.server_close()
