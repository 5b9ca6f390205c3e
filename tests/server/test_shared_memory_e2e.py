"""Shared memory against the real server: REST routes, opt-in, and a region unregistered in use."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator
from multiprocessing import shared_memory

import numpy as np
import pytest

from ortserve.testing import ServerProcess
from shared_memory_helpers import buffer_of

pytestmark = pytest.mark.e2e

SLOW_BYTES = 256 * 256 * 4


def _request(method: str, path: str, body: bytes = b"", headers: str = "") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{headers}\r\n"
    return head.encode() + body


def _read_responses(sock: socket.socket, count: int) -> list[tuple[int, dict[str, str], bytes]]:
    """``count`` responses read off one keep-alive connection, in order."""
    buffer = b""
    answers: list[tuple[int, dict[str, str], bytes]] = []
    while len(answers) < count:
        while b"\r\n\r\n" not in buffer:
            chunk = sock.recv(65536)
            assert chunk, "connection closed early"
            buffer += chunk
        head, buffer = buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {name.lower(): value for name, value in (line.split(": ", 1) for line in lines[1:])}
        length = int(headers["content-length"])
        while len(buffer) < length:
            buffer += sock.recv(65536)
        answers.append((int(lines[0].split()[1]), headers, buffer[:length]))
        buffer = buffer[length:]
    return answers


def _exchange(server: ServerProcess, *requests: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Send ``requests`` pipelined in one write; the server handles them in that order."""
    with socket.create_connection((server.host, server.http_port), timeout=30) as sock:
        sock.sendall(b"".join(requests))
        return _read_responses(sock, len(requests))


@pytest.fixture
def block() -> Iterator[shared_memory.SharedMemory]:
    created = shared_memory.SharedMemory(f"ortserve-e2e-{uuid.uuid4().hex}", create=True, size=2 * SLOW_BYTES)
    yield created
    created.close()
    created.unlink()


def _register(name: str, key: str, byte_size: int, offset: int = 0) -> bytes:
    body = json.dumps({"key": key, "offset": offset, "byte_size": byte_size}).encode()
    return _request("POST", f"/v2/systemsharedmemory/region/{name}/register", body)


def test_a_region_unregistered_while_a_request_uses_it_serves_that_request(
    error_repository_server: ServerProcess, block: shared_memory.SharedMemory
) -> None:
    """Infer (slow model) and unregister pipelined on one connection: the server decodes the
    infer first, unregisters while it runs, and still writes the output into the region."""
    key = "/" + block.name.lstrip("/")
    np.ndarray((256, 256), np.float32, buffer_of(block))[:] = np.eye(256, dtype=np.float32) * 1.0
    ((status, _, _),) = _exchange(error_repository_server, _register("in-use", key, 2 * SLOW_BYTES))
    assert status == 200
    document = {
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": [1, 256, 256],
                "parameters": {"shared_memory_region": "in-use", "shared_memory_byte_size": SLOW_BYTES},
            }
        ],
        "outputs": [
            {
                "name": "y",
                "parameters": {
                    "shared_memory_region": "in-use",
                    "shared_memory_byte_size": SLOW_BYTES,
                    "shared_memory_offset": SLOW_BYTES,
                },
            }
        ],
    }
    infer = _request("POST", "/v2/models/slow/infer", json.dumps(document).encode())
    unregister = _request("POST", "/v2/systemsharedmemory/region/in-use/unregister")
    status_after = _request("GET", "/v2/systemsharedmemory/status")
    (infer_status, _, infer_body), (unregister_status, _, _), (_, _, listed) = _exchange(
        error_repository_server, infer, unregister, status_after
    )
    assert unregister_status == 200 and json.loads(listed) == []
    assert infer_status == 200, infer_body
    output = json.loads(infer_body)["outputs"][0]
    assert "data" not in output
    assert output["parameters"] == {
        "shared_memory_region": "in-use",
        "shared_memory_offset": SLOW_BYTES,
        "shared_memory_byte_size": SLOW_BYTES,
    }
    written = np.ndarray((256, 256), np.float32, buffer_of(block), offset=SLOW_BYTES)
    assert np.array_equal(written, np.eye(256, dtype=np.float32))


@pytest.mark.parametrize(
    ("request_bytes", "status", "fragment"),
    [
        (_request("GET", "/v2/systemsharedmemory/region/a/register"), 405, "method not allowed"),
        (_request("POST", "/v2/systemsharedmemory/status"), 405, "method not allowed"),
        (_request("GET", "/v2/systemsharedmemory/region/a/delete"), 404, "no route"),
        (_request("GET", "/v2/systemsharedmemory"), 404, "no route"),
        (_request("POST", "/v2/systemsharedmemory/region/a/register", b"[1]"), 400, "JSON object"),
        (_request("POST", "/v2/systemsharedmemory/region/a/register", b"{x"), 400, "not valid JSON"),
        (_request("POST", "/v2/systemsharedmemory/region/a/register", b'{"key": "/k"}'), 400, "byte_size"),
        (_request("POST", "/v2/cudasharedmemory/region/a/register", b"{}"), 501, "CUDA shared memory"),
        (_request("POST", "/v2/cudasharedmemory/unregister"), 501, "CUDA shared memory"),
    ],
    ids=lambda value: value.split(b"\r\n")[0].decode() if isinstance(value, bytes) else str(value),
)
def test_rest_routes_refuse_what_they_do_not_define(
    error_repository_server: ServerProcess, request_bytes: bytes, status: int, fragment: str
) -> None:
    ((answered, headers, body),) = _exchange(error_repository_server, request_bytes)
    assert answered == status
    assert fragment in json.loads(body)["error"]
    if status == 405:
        assert headers["allow"] in ("GET, HEAD, OPTIONS", "POST, OPTIONS")


def test_shared_memory_is_off_unless_the_server_allows_regions(
    server: ServerProcess, block: shared_memory.SharedMemory
) -> None:
    key = "/" + block.name.lstrip("/")
    ((status, _, body),) = _exchange(server, _register("a", key, 16))
    assert status == 501 and "--shared-memory-regions" in json.loads(body)["error"]
    ((_, _, metadata),) = _exchange(server, _request("GET", "/v2"))
    assert "system_shared_memory" not in json.loads(metadata)["extensions"]
