"""HTTP/1.1 details clients rely on: pipelining in order, chunked bodies, 100-continue, HTTP/1.0."""

from __future__ import annotations

import contextlib
import json
import socket
import time

import pytest

from ortserve.testing import ServerProcess
from tcp_table import cpu_ticks, server_side_of
from waiting import wait_until

pytestmark = pytest.mark.e2e


def body_for(value: float) -> bytes:
    return json.dumps(
        {
            "id": str(value),
            "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [value] * 64}],
        }
    ).encode()


def read_responses(sock: socket.socket, count: int) -> list[tuple[bytes, bytes]]:
    """Read ``count`` responses (status line, body) framed by Content-Length."""
    buffer = b""
    responses: list[tuple[bytes, bytes]] = []
    while len(responses) < count:
        while b"\r\n\r\n" not in buffer:
            chunk = sock.recv(65536)
            assert chunk, "connection closed early"
            buffer += chunk
        head, buffer = buffer.split(b"\r\n\r\n", 1)
        lines = head.split(b"\r\n")
        length = next(
            int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length")
        )
        while len(buffer) < length:
            buffer += sock.recv(65536)
        responses.append((lines[0], buffer[:length]))
        buffer = buffer[length:]
    return responses


def post(body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST /v2/models/small_mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n"
        % (len(body), extra)
        + body
    )


def test_pipelined_requests_are_answered_in_order(server: ServerProcess) -> None:
    with socket.create_connection((server.host, server.http_port), timeout=10) as sock:
        sock.sendall(
            b"".join(post(body_for(v)) for v in (1.0, 2.0, 3.0)) + b"GET /v2/health/live HTTP/1.1\r\n\r\n"
        )
        responses = read_responses(sock, 4)
    assert [json.loads(body)["id"] for _, body in responses[:3]] == ["1.0", "2.0", "3.0"]
    assert all(status.startswith(b"HTTP/1.1 200") for status, _ in responses)


def test_chunked_request_body_is_accepted(server: ServerProcess) -> None:
    body = body_for(0.5)
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:10], body[10:])) + b"0\r\n\r\n"
    request = (
        b"POST /v2/models/small_mlp/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks
    )
    with socket.create_connection((server.host, server.http_port), timeout=10) as sock:
        sock.sendall(request)
        ((status, answer),) = read_responses(sock, 1)
    assert status.startswith(b"HTTP/1.1 200") and json.loads(answer)["id"] == "0.5"


def test_expect_100_continue_gets_an_interim_response(server: ServerProcess) -> None:
    body = body_for(0.25)
    head = post(body, b"Expect: 100-continue\r\n")[: -len(body)]
    with socket.create_connection((server.host, server.http_port), timeout=10) as sock:
        sock.sendall(head)
        assert sock.recv(4096).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(body)
        ((status, _),) = read_responses(sock, 1)
    assert status.startswith(b"HTTP/1.1 200")


def test_http_1_0_without_keep_alive_is_closed_after_the_answer(server: ServerProcess) -> None:
    with socket.create_connection((server.host, server.http_port), timeout=10) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.0\r\n\r\n")
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200") and b"connection: close" in data.lower()


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


class Settled:
    """True once the server has filled ``client``'s connection with answers it does not read and
    then used (almost) no CPU for a whole check interval: it is doing no more for them. A server
    that went on making the answers nobody reads would be busy until it had made them all."""

    def __init__(self, server: ServerProcess, client: socket.socket) -> None:
        self.server, self.client = server, client
        self.ticks, self.at = cpu_ticks(server.process.pid), time.monotonic()

    def __call__(self) -> bool:
        ticks, at = cpu_ticks(self.server.process.pid), time.monotonic()
        side = server_side_of(self.client, self.server.http_port)
        quiet = ticks - self.ticks <= 2 and at - self.at >= 0.09  # at most 20 ms of CPU in 100 ms
        self.ticks, self.at = ticks, at
        return quiet and side is not None and side.unsent > 0


def test_pipelined_answers_a_client_does_not_read_are_not_made_until_it_reads(server: ServerProcess) -> None:
    """1,000 pipelined GETs of the metrics page (made anew for each) from a client that reads
    nothing: the server stops answering once its send buffer is full (it made every answer
    before: +32 MiB for 2,000, +1 MiB now), and every answer comes, in
    order, once the client reads."""
    count = 1000
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    before = rss_bytes(server.process.pid)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(30)
        sock.connect((server.host, server.http_port))
        sock.sendall(request * count)
        wait_until(Settled(server, sock), 30, "the server to stop answering", poll_s=0.1)
        grown = rss_bytes(server.process.pid) - before
        responses = read_responses(sock, count)
    assert grown < 8 << 20, f"the server grew by {grown >> 20} MiB for answers nobody read"
    assert len(responses) == count and all(status.startswith(b"HTTP/1.1 200") for status, _ in responses)


def test_an_offer_to_switch_protocols_is_ignored_and_the_request_served_as_http_1_1(
    server: ServerProcess,
) -> None:
    """curl --http2 and Java's RestClient offer h2c on every request: the request is served as
    if the offer were not there (RFC 9110 7.8), body included, even one arriving after the
    head, and the connection goes on; a WebSocket offer too. Each gets exactly one answer."""
    body = body_for(7.0)
    offer = (
        b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"
    )
    request = post(body, offer)
    with socket.create_connection((server.host, server.http_port), timeout=10) as sock:
        sock.sendall(request[: -len(body)])
        wait_until(  # the server has read the head: the body comes in a later read
            lambda: (side := server_side_of(sock, server.http_port)) is not None and side.unread == 0,
            10,
            "the head read",
        )
        sock.sendall(
            request[-len(body) :]
            + b"GET /v2/health/live HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
        )
        sock.sendall(post(body_for(8.0)))
        responses = read_responses(sock, 3)
        sock.settimeout(0.5)
        with contextlib.suppress(TimeoutError):
            assert sock.recv(1) == b""  # nothing more: no second answer to any of them
    assert [status[:12] for status, _ in responses] == [b"HTTP/1.1 200"] * 3
    assert json.loads(responses[0][1])["id"] == "7.0" and json.loads(responses[2][1])["id"] == "8.0"
