"""End to end with KServe's own Python client (``kserve``): health, model readiness and infer on
both transports, as a KServe user (or KServe's graph router) would call the server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from model_builders import mlp_reference
from ortserve.testing import ServerProcess

pytestmark = pytest.mark.e2e

CALLS = Path(__file__).parent.parent / "kserve_calls.py"


@pytest.fixture(scope="module")
def answers(server: ServerProcess) -> dict[str, dict[str, object]]:
    done = subprocess.run(
        [sys.executable, str(CALLS), server.http_url, server.grpc_address],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, dict[str, object]] = json.loads(done.stdout)
    return found


@pytest.mark.parametrize("transport", ["rest", "grpc"])
def test_kserves_client_sees_a_live_ready_server_and_model(
    answers: dict[str, dict[str, object]], transport: str
) -> None:
    seen = answers[transport]
    assert (seen["live"], seen["ready"], seen["model_ready"]) == (True, True, True)


@pytest.mark.parametrize(
    ("transport", "call", "request_id"),
    [
        ("rest", "infer_binary_False", "rest-False"),
        ("rest", "infer_binary_True", "rest-True"),
        ("grpc", "infer", "grpc"),
    ],
)
def test_kserves_client_infers(
    answers: dict[str, dict[str, object]], demo_repository: Path, transport: str, call: str, request_id: str
) -> None:
    answer_id, rows = cast("list[object]", answers[transport][call])
    data = np.random.default_rng(11).standard_normal((3, 64)).astype(np.float32)
    expected = mlp_reference(demo_repository / "small_mlp" / "1" / "model.onnx", data)
    assert answer_id == request_id
    np.testing.assert_allclose(np.asarray(rows, dtype=np.float32), expected, rtol=1e-4, atol=1e-4)
