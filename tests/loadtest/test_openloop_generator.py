"""The native open-loop generator (benchmarks/openloop) against a real server: built with gcc,
run for about a second at a modest rate over HTTP/1.1 and gRPC against the shared demo server; every request accounted for, and
answers counted by their real status (HTTP status line, gRPC ``grpc-status`` trailer)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ortserve.loadtest.grpc_transport import encode_request
from ortserve.loadtest.inputs import encode_payload, fetch_input_specs, generated_inputs, infer_path
from ortserve.loadtest.transports import HttpTarget
from ortserve.testing import ServerProcess

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("gcc") is None, reason="the generator is built with gcc"),
]

RUN = Path(__file__).parent.parent.parent / "benchmarks" / "openloop" / "run.py"
INFER = "/inference.GRPCInferenceService/ModelInfer"


def generate(tmp_path: Path, target: str, request: bytes, *extra: str) -> dict[str, object]:
    path = tmp_path / "request"
    path.write_bytes(request)
    command = [sys.executable, str(RUN), target, "--request", str(path), "--rate", "300", "--seconds", "1"]
    command += ["--warmup", "0.2", "--connections", "8", "--timeout", "10", *extra]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    summary: dict[str, object] = json.loads(done.stdout)
    return summary


def number(summary: dict[str, object], key: str) -> int:
    value = summary[key]
    assert isinstance(value, int)
    return value


def assert_accounted(summary: dict[str, object]) -> dict[str, int]:
    """Every offered request ends exactly once; returns the completed ones by status."""
    sent, offered = number(summary, "sent"), number(summary, "offered")
    assert sent == number(summary, "completed") + number(summary, "timeouts") + number(summary, "errors")
    assert offered == sent + number(summary, "expired_in_queue")
    assert offered == 360  # 300/s over 1.2 s
    statuses = summary["statuses"]
    assert isinstance(statuses, dict)
    assert sum(statuses.values()) == number(summary, "completed")
    return statuses


def http_request(server: ServerProcess, model: str) -> bytes:
    target = HttpTarget(server.host, server.http_port)
    arrays = generated_inputs(fetch_input_specs(target, "small_mlp", None), count=1)[0]
    return target.wire(encode_payload(arrays, infer_path(model, None), "json"))


def grpc_message(server: ServerProcess, model: str) -> bytes:
    target = HttpTarget(server.host, server.http_port)
    arrays = generated_inputs(fetch_input_specs(target, "small_mlp", None), count=1)[0]
    return encode_request(arrays, model, None)


def test_http_requests_are_all_accounted_for_and_200s_counted(server: ServerProcess, tmp_path: Path) -> None:
    summary = generate(tmp_path, server.http_url, http_request(server, "small_mlp"))
    statuses = assert_accounted(summary)
    assert statuses.get("200", 0) > 0
    window = summary["window"]
    assert isinstance(window, dict) and window["ok"] > 0 and window["ok_latency_ms"]["count"] == window["ok"]


def test_http_error_answers_are_counted_by_status_not_as_ok(server: ServerProcess, tmp_path: Path) -> None:
    summary = generate(tmp_path, server.http_url, http_request(server, "no_such_model"))
    statuses = assert_accounted(summary)
    assert statuses.get("404", 0) > 0 and "200" not in statuses
    window = summary["window"]
    assert isinstance(window, dict) and window["ok"] == 0 and window["ok_latency_ms"] is None


def test_grpc_calls_are_all_accounted_for_and_ok_read_from_the_trailers(
    server: ServerProcess, tmp_path: Path
) -> None:
    message = grpc_message(server, "small_mlp")
    summary = generate(tmp_path, server.grpc_address, message, "--grpc-path", INFER, "--connections", "2")
    statuses = assert_accounted(summary)
    assert statuses.get("1000", 0) > 0  # grpc-status 0
    assert summary["protocol_errors"] == 0


def test_grpc_failures_carry_their_grpc_status(server: ServerProcess, tmp_path: Path) -> None:
    message = grpc_message(server, "no_such_model")
    summary = generate(tmp_path, server.grpc_address, message, "--grpc-path", INFER)
    statuses = assert_accounted(summary)
    assert set(statuses) == {"1005"}  # NOT_FOUND, in a trailers-only answer
