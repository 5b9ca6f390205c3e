"""The real server under --max-connections and --header-timeout: one cap across HTTP and gRPC,
silent sockets evicted for real clients, a clean refusal when nothing can be evicted, and a
slowloris head closed after the header timeout."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from ortserve.testing import ServerProcess, run_server
from tcp_table import ESTABLISHED, ServerSide, server_side, server_side_of
from waiting import wait_until

pytestmark = pytest.mark.e2e

CAP = 4


@pytest.fixture(scope="module")
def capped(demo_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("limits") / "server.log"
    args = ["--max-connections", str(CAP)]
    with run_server(demo_repository, log, args, env={"ORTSERVE_HEADER_TIMEOUT": "0.5"}) as process:
        yield process


def http_infer(server: ServerProcess) -> np.ndarray:
    address = server.http_address
    with contextlib.closing(httpclient.InferenceServerClient(address, network_timeout=5)) as client:
        return infer(client, httpclient)


def grpc_infer(server: ServerProcess) -> np.ndarray:
    with contextlib.closing(grpcclient.InferenceServerClient(server.grpc_address)) as client:
        return infer(client, grpcclient, client_timeout=5)


def infer(client: object, module: object, **timeout: float) -> np.ndarray:
    data = np.full((1, 64), 0.5, np.float32)
    tensor = module.InferInput("input", [1, 64], "FP32")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(data)
    result = client.infer("small_mlp", [tensor], **timeout)  # type: ignore[attr-defined]
    return result.as_numpy("output")  # type: ignore[no-any-return]


@contextlib.contextmanager
def sockets(server: ServerProcess, count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections, alternately to the HTTP and the gRPC port."""
    opened: list[socket.socket] = []
    try:
        for i in range(count):
            port = server.http_port if i % 2 == 0 else server.grpc_port
            opened.append(socket.create_connection((server.host, port), timeout=5))
        yield opened
    finally:
        for sock in opened:
            sock.close()


@contextlib.contextmanager
def bodies_under_way(server: ServerProcess, count: int) -> Iterator[list[socket.socket]]:
    """``count`` HTTP requests the server has begun to read, then stalled: each sends 5,000
    bytes of 100,000, which would keep its connection for 0.5 s + 10 s."""
    head = (
        b"POST /v2/models/small_mlp/infer HTTP/1.1\r\nContent-Length: 100000\r\nExpect: 100-continue\r\n\r\n"
    )
    with contextlib.ExitStack() as stack:
        stalled = []
        for _ in range(count):
            sock = stack.enter_context(socket.create_connection((server.host, server.http_port), timeout=5))
            sock.sendall(head)
            assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")  # the server read the head
            sock.sendall(b"{" * 5000)
            stalled.append(sock)
        yield stalled


def test_silent_sockets_beyond_the_cap_do_not_lock_out_either_transport(capped: ServerProcess) -> None:
    with sockets(capped, 10 * CAP):
        assert http_infer(capped).shape == (1, 16)
        assert grpc_infer(capped).shape == (1, 16)


def test_requests_stalled_mid_body_make_room_for_new_clients_of_either_transport(
    capped: ServerProcess,
) -> None:
    """Every place holds a request that stopped halfway: new clients take their places (they
    used to be refused until the stalled ones timed out)."""
    with bodies_under_way(capped, CAP) as stalled:
        assert http_infer(capped).shape == (1, 16)
        assert grpc_infer(capped).shape == (1, 16)
        assert stalled[0].recv(100) == b""  # the oldest stalled request made room


def test_a_slowloris_head_is_answered_408_and_closed(capped: ServerProcess) -> None:
    with socket.create_connection((capped.host, capped.http_port), timeout=5) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408 ") and b"connection: close" in answer


def test_a_client_that_reads_no_answers_for_a_keepalive_timeout_is_reset(
    demo_repository: Path, tmp_path: Path
) -> None:
    """Pipelined requests and no reads: the server holds back its answers, and once the client
    has read nothing for the keep-alive timeout its connection is reset, so that neither the
    server nor the kernel (a closed socket keeps its send queue in FIN-WAIT-1 for as long as
    the peer's window stays shut) holds the unsent answers."""
    env = {"ORTSERVE_KEEPALIVE_TIMEOUT": "1", "ORTSERVE_HEADER_TIMEOUT": "30"}  # no head times out
    with run_server(demo_repository, tmp_path / "server.log", env=env) as process:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect((process.host, process.http_port))
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 1000)

            def holding() -> ServerSide | None:  # answers fill what the client's window lets through
                side = server_side_of(sock, process.http_port)
                return side if side is not None and side.unsent > 0 else None

            held = wait_until(holding, 10, "answers held in the server's send queue")
            assert held.state == ESTABLISHED and len(server_side(process.http_port)) == 1
            wait_until(  # the keep-alive timeout (1 s) and a tick of the deadline check
                lambda: server_side(process.http_port) == [], 10, "the connection reset"
            )
        assert http_infer(process).shape == (1, 16)
