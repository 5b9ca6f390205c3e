"""Seeded random malformed requests: never a 5xx, never a hang, and the server keeps serving."""

from __future__ import annotations

import contextlib
import http.client
import json
import random
from typing import Any

import pytest

from ortserve.testing import ServerProcess

pytestmark = pytest.mark.e2e

DATATYPES = ["FP32", "FP16", "FP64", "INT8", "INT64", "UINT8", "BOOL", "BYTES", "BF16", "fp32", "", "X" * 300]
ODD_VALUES: list[Any] = [
    None,
    0,
    -1,
    2**70,
    -(2**70),
    1.5,
    float("inf"),
    "",
    "x",
    "1.5",
    [],
    [[]],
    {},
    {"a": 1},
    True,
    False,
    [None],
    ["a", 1],
    [[1, 2], [3]],
    [1e308, -1e308],
    [2**64],
]


def valid() -> dict[str, Any]:
    return {
        "id": "f",
        "inputs": [{"name": "input", "shape": [2, 64], "datatype": "FP32", "data": [0.5] * 128}],
        "outputs": [{"name": "output"}],
        "parameters": {"priority": 0},
    }


def mutate(rng: random.Random) -> dict[str, Any]:
    document = valid()
    tensor = document["inputs"][0]
    for _ in range(rng.randint(1, 3)):
        choice = rng.randrange(9)
        if choice == 0:
            tensor["shape"] = [rng.choice([-5, 0, 1, 2, 64, 10**12, 2**63]) for _ in range(rng.randint(0, 5))]
        elif choice == 1:
            tensor["datatype"] = rng.choice(DATATYPES)
        elif choice == 2:
            tensor["data"] = rng.choice([*ODD_VALUES, [0.5] * rng.randint(0, 300)])
        elif choice == 3:
            tensor[rng.choice(["name", "shape", "datatype", "data", "parameters"])] = rng.choice(ODD_VALUES)
        elif choice == 4:
            document[rng.choice(["id", "inputs", "outputs", "parameters"])] = rng.choice(ODD_VALUES)
        elif choice == 5:
            document["parameters"] = {
                rng.choice(["priority", "timeout", "binary_data_output", "x"]): rng.choice(ODD_VALUES)
            }
        elif choice == 6:
            tensor["parameters"] = {"binary_data_size": rng.choice([*ODD_VALUES, 4, 512, 10**15])}
        elif choice == 7:
            document["outputs"] = [
                {
                    "name": rng.choice(["output", "nope", ""]),
                    "parameters": {"binary_data": rng.choice(ODD_VALUES)},
                }
            ]
        else:
            nested: Any = [0.5]
            for _ in range(rng.randint(1, 80)):
                nested = [nested]
            tensor["data"] = nested
    return document


def send(server: ServerProcess, body: bytes, headers: dict[str, str]) -> int:
    connection = http.client.HTTPConnection(server.host, server.http_port, timeout=20)
    try:
        connection.request("POST", "/v2/models/small_mlp/infer", body, headers)
        reply = connection.getresponse()
        reply.read()
        return reply.status
    finally:
        connection.close()


def test_random_malformed_json_requests_get_4xx(server: ServerProcess) -> None:
    rng = random.Random(20261130)
    statuses: dict[int, int] = {}
    for _ in range(400):
        body = json.dumps(mutate(rng), allow_nan=True).encode()
        status = send(server, body, {})
        statuses[status] = statuses.get(status, 0) + 1
        assert status < 500, (status, body[:300])
    assert statuses.get(400, 0) > 200
    assert send(server, json.dumps(valid()).encode(), {}) == 200


def test_random_binary_framing_gets_4xx(server: ServerProcess) -> None:
    rng = random.Random(7)
    for _ in range(200):
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": "input",
                        "shape": [1, 64],
                        "datatype": rng.choice(DATATYPES[:8]),
                        "parameters": {"binary_data_size": rng.choice([0, 4, 255, 256, 257])},
                    }
                ]
            }
        )
        payload = bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 3, 256, 300])))
        body = header.encode() + payload
        claimed = rng.choice([len(header), len(header) + 1, len(body) + 5, 0, -1])
        status = send(server, body, {"Inference-Header-Content-Length": str(claimed)})
        assert status < 500, status
    assert send(server, json.dumps(valid()).encode(), {}) == 200


def test_random_bytes_as_http_never_break_the_server(server: ServerProcess) -> None:
    import socket

    rng = random.Random(11)
    for _ in range(100):
        garbage = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 600)))
        with socket.create_connection((server.host, server.http_port), timeout=10) as sock:
            sock.sendall(
                rng.choice([b"", b"POST / HTTP/1.1\r\n", b"GET /v2 HTTP/1.1\r\nContent-Length: 5\r\n\r\n"])
                + garbage
            )
            sock.shutdown(socket.SHUT_WR)
            with contextlib.suppress(ConnectionResetError, TimeoutError):
                sock.recv(4096)
    assert send(server, json.dumps(valid()).encode(), {}) == 200
