"""What the log stream holds: pure JSON lines under --log-format json (ONNX Runtime's own
logger included), trace and span ids inside a traced request, access-log fields as keys, a
quiet CPU start, no ONNX Runtime telemetry store, and gzip on the metrics port."""

from __future__ import annotations

import gzip
import io
import json
import logging
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from model_builders import write_error_repository
from ortserve.logs import TRACE, make_formatter
from ortserve.ort_runtime import ort_log_severity
from ortserve.testing import free_port, run_server

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_record_inside_a_traced_request_carries_its_trace_and_span_ids() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(make_formatter("json"))
    from ortserve.logs import _RequestContext  # the filter configure_logging installs

    handler.addFilter(_RequestContext())
    logger = logging.getLogger("log-records-test")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    token = TRACE.set(("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"))
    try:
        logger.info("inside", extra={"status": 200, "latency_ms": 1.5})
    finally:
        TRACE.reset(token)
        logger.info("outside")
        logger.removeHandler(handler)
    inside, outside = (json.loads(line) for line in stream.getvalue().splitlines())
    assert (inside["trace_id"], inside["span_id"]) == ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
    assert (inside["status"], inside["latency_ms"]) == (200, 1.5)
    assert "trace_id" not in outside


@pytest.mark.parametrize(
    ("level", "fmt", "severity"),
    [
        ("INFO", "json", 4),
        ("DEBUG", "json", 4),
        ("INFO", "text", 3),
        ("DEBUG", "text", 2),
        ("ERROR", "text", 4),
    ],
)
def test_onnxruntimes_logger_severity_follows_the_format_and_level(
    level: str, fmt: str, severity: int
) -> None:
    assert ort_log_severity(level, fmt) == severity


def test_configuring_logging_never_imports_onnxruntime() -> None:
    """The supervisor configures logging, then forks a zygote that must import ONNX Runtime itself."""
    code = (
        "import sys; from ortserve.logs import configure_logging; configure_logging('INFO', 'json'); "
        "from ortserve.ort_runtime import session_log_severity; "
        "assert 'onnxruntime' not in sys.modules; assert session_log_severity() == 4"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_warnings_and_uncaught_thread_exceptions_are_json_records_too() -> None:
    code = (
        "import threading, warnings; from ortserve.logs import configure_logging; "
        "configure_logging('INFO', 'json'); "
        "thread = threading.Thread(target=lambda: 1 / 0, name='worker-x'); thread.start(); thread.join(); "
        "warnings.warn('a user warning')"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    records = [json.loads(line) for line in run.stderr.splitlines()]  # every line is one
    assert [r["logger"] for r in records] == ["ortserve.threads", "py.warnings"]
    assert "ZeroDivisionError" in records[0]["exception"]


@pytest.mark.e2e
def test_json_logs_stay_json_when_onnxruntime_fails_and_carry_trace_ids_and_access_fields(
    tmp_path: Path,
) -> None:
    root = tmp_path / "models"
    write_error_repository(root)
    env = {
        "HOME": str(tmp_path / "home"),  # where ONNX Runtime would write its telemetry store
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",  # nobody listens
        "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
    }
    (tmp_path / "home").mkdir()
    args = ["--log-format", "json", "--access-log", "--trace-sampling-ratio", "1", "--no-strict-readiness"]
    with run_server(root, tmp_path / "server.log", args, env) as server:
        client = httpclient.InferenceServerClient(server.http_address)
        try:
            for rows in (1, 3):  # one row fails inside ONNX Runtime (500), three answer
                tensor = httpclient.InferInput("x", [rows, 4], "FP32")
                tensor.set_data_from_numpy(np.zeros((rows, 4), np.float32))
                try:
                    client.infer("failing", [tensor], headers={"traceparent": TRACEPARENT})
                except InferenceServerException as error:
                    assert error.status() == "500"
        finally:
            client.close()
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.metrics_port}/metrics", headers={"Accept-Encoding": "gzip"}
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            assert reply.headers["Content-Encoding"] == "gzip"
            assert b"ortserve_" in gzip.decompress(reply.read())
        assert server.stop() == 0
    records = [json.loads(line) for line in server.log().splitlines() if line.strip()]  # every line
    access = [r for r in records if r["logger"] == "ortserve.access"]
    assert {r["status"] for r in access} == {500, 200}
    assert all(isinstance(r["latency_ms"], float) and r["transport"] == "http" for r in access)
    assert all(
        r["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736" and len(r["span_id"]) == 16 for r in access
    )
    # ONNX Runtime's failure comes as ortserve's JSON record (its own ANSI line is silenced).
    assert any(r["logger"] == "ortserve.core.batch" and "Reshape" in r.get("exception", "") for r in records)
    assert not any("NVML" in r["message"] for r in records)  # a quiet CPU start
    assert not (tmp_path / "home" / ".cache" / "Microsoft").exists()  # no telemetry store
