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
    ("level", "severity"),
    [("DEBUG", 1), ("INFO", 2), ("WARNING", 2), ("ERROR", 3), ("CRITICAL", 4)],
)
def test_onnxruntimes_logger_threshold_follows_the_level(level: str, severity: int) -> None:
    assert ort_log_severity(level) == severity


def test_configuring_logging_never_imports_onnxruntime() -> None:
    """The supervisor configures logging, then forks a zygote that must import ONNX Runtime itself."""
    code = (
        "import sys; from ortserve.logs import configure_logging; configure_logging('INFO', 'json'); "
        "from ortserve.ort_runtime import session_log_severity; "
        "assert 'onnxruntime' not in sys.modules; assert session_log_severity() == 2"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


_FAILING_RUN = """
import numpy as np
from onnx import TensorProto, helper
import onnxruntime as ort
from ortserve.ort_runtime import session_log_severity
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
shape = helper.make_tensor("s", TensorProto.INT64, [2], [2, 2])
graph = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["y"])], "g", [x], [y], [shape])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 9
options = ort.SessionOptions()
options.log_severity_level = session_log_severity()  # as core/session.py builds each session
session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
try:
    session.run(None, {"x": np.zeros((3, 4), np.float32)})
except Exception:
    pass
"""


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_onnxruntimes_own_lines_go_through_the_log_with_their_severity(fmt: str) -> None:
    """Logging is configured before ONNX Runtime is imported (as the zygote of --workers does);
    the first session built installs the callback, and ONNX Runtime's error line comes out as an
    ``onnxruntime`` record at ERROR in the log's format, never as its own ANSI text."""
    code = f"from ortserve.logs import configure_logging; configure_logging('INFO', {fmt!r})\n" + _FAILING_RUN
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "\x1b[" not in run.stderr  # none of ONNX Runtime's colour codes
    lines = run.stderr.splitlines()
    if fmt == "json":
        records = [json.loads(line) for line in lines]  # every line is one
        assert [(r["logger"], r["level"]) for r in records] == [("onnxruntime", "ERROR")]
        assert records[0]["code_location"].startswith("sequential_executor.cc")
        assert "Reshape" in records[0]["message"] and records[0]["ort_category"] == "onnxruntime"
    else:
        assert len(lines) == 1 and " ERROR onnxruntime: " in lines[0] and "Reshape" in lines[0]


def test_onnxruntimes_warnings_wait_for_their_level() -> None:
    """At ERROR, ONNX Runtime's errors still come; at CRITICAL nothing does."""
    for level, expected in (("ERROR", 1), ("CRITICAL", 0)):
        code = (
            f"from ortserve.logs import configure_logging; configure_logging({level!r}, 'json')\n"
            + _FAILING_RUN
        )
        run = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
        )
        assert len([json.loads(line) for line in run.stderr.splitlines()]) == expected


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
    # ONNX Runtime's own line comes through ortserve's log as a JSON record, severity mapped;
    # the failed request is also ortserve's record, with the exception.
    ort_records = [r for r in records if r["logger"] == "onnxruntime"]
    assert ort_records and all(r["level"] == "ERROR" for r in ort_records)
    assert all(
        "Reshape" in r["message"] and r["code_location"] and "\x1b" not in r["message"] for r in ort_records
    )
    assert any(r["logger"] == "ortserve.core.batch" and "Reshape" in r.get("exception", "") for r in records)
    assert not any("NVML" in r["message"] for r in records)  # a quiet CPU start
    assert not (tmp_path / "home" / ".cache" / "Microsoft").exists()  # no telemetry store
