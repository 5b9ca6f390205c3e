"""A few hundred clients on a model whose queue holds far fewer (issue 30): every answer the
real server gives is the model's correct output or a 429 with Retry-After, on connections
that stay usable; none is lost, none is another status."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from ortserve.demo import build_mlp
from ortserve.testing import ServerProcess, run_server

pytestmark = pytest.mark.e2e

CLIENTS = 300
REQUESTS_EACH = 3
WIDTH = 64
CONFIG = """\
batching:
  max_batch_size: 4
  max_queue_delay_ms: 1.0
  max_queue_size: 8
"""


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("overload_models")
    version = root / "crowded" / "1"
    version.mkdir(parents=True)
    onnx.save(build_mlp([WIDTH, 128, 8], 7, "crowded"), str(version / "model.onnx"))
    (root / "crowded" / "config.yaml").write_text(CONFIG, encoding="utf-8")
    return version / "model.onnx"


@pytest.fixture(scope="module")
def crowded(model_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("overload_logs") / "server.log"
    with run_server(model_file.parent.parent.parent, log, ["--intra-op-threads", "1"]) as server:
        yield server


def request_bytes(rows: np.ndarray) -> bytes:
    body = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": list(rows.shape),
                    "datatype": "FP32",
                    "data": rows.ravel().tolist(),
                }
            ]
        }
    ).encode()
    head = (
        f"POST /v2/models/crowded/infer HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers["content-length"]))
    return status, headers, body


async def client(
    server: ServerProcess,
    number: int,
    inputs: np.ndarray,
    outcomes: list[tuple[int, int, dict[str, str], bytes]],
) -> None:
    reader, writer = await asyncio.open_connection(server.host, server.http_port)
    try:
        for i in range(REQUESTS_EACH):
            index = number * REQUESTS_EACH + i
            writer.write(request_bytes(inputs[index : index + 1]))
            status, headers, body = await read_response(reader)
            outcomes.append((index, status, headers, body))
    finally:
        writer.close()


async def crowd(server: ServerProcess, inputs: np.ndarray) -> list[tuple[int, int, dict[str, str], bytes]]:
    outcomes: list[tuple[int, int, dict[str, str], bytes]] = []
    async with asyncio.timeout(120):
        await asyncio.gather(*(client(server, n, inputs, outcomes) for n in range(CLIENTS)))
    return outcomes


def test_every_answer_to_a_crowd_is_correct_or_a_429_with_retry_after(
    crowded: ServerProcess, model_file: Path
) -> None:
    rng = np.random.default_rng(3)
    inputs = rng.standard_normal((CLIENTS * REQUESTS_EACH, WIDTH)).astype(np.float32)
    session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"input": inputs})[0]

    outcomes = asyncio.run(crowd(crowded, inputs))

    assert len(outcomes) == CLIENTS * REQUESTS_EACH  # every request answered, on its connection
    served = refused = 0
    for index, status, headers, body in outcomes:
        if status == 200:
            output = json.loads(body)["outputs"][0]
            got = np.array(output["data"], dtype=np.float32).reshape(output["shape"])
            np.testing.assert_allclose(got, expected[index : index + 1], rtol=1e-4, atol=1e-5)
            served += 1
        else:
            assert status == 429, (status, body)
            assert int(headers["retry-after"]) >= 1
            assert "error" in json.loads(body)
            refused += 1
    assert served > 0
    assert refused > 0  # 300 clients at once against a queue of 8: the crowd was refused in part
