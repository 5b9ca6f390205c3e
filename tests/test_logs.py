"""Log lines carry the request's id, model and version; the access log is one line per request."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from ortserve.demo import write_demo_repository
from ortserve.errors import InvalidInput
from ortserve.logs import configure_logging
from ortserve.statistics import ServerStatistics
from ortserve.telemetry import Telemetry
from ortserve.testing import run_server


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """A buffer that ``configure`` points the CLI's log handler at; logging restored afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield io.StringIO()
    root.handlers[:] = handlers
    root.setLevel(level)


def configure(fmt: str, stream: io.StringIO) -> None:
    configure_logging("INFO", fmt)
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)


def test_json_lines_carry_the_request_context_while_bound(captured: io.StringIO) -> None:
    configure("json", captured)
    scope = Telemetry(ServerStatistics()).begin("http", "m", "2", "req-7", None)
    with scope.bound():
        logging.getLogger("ortserve.test").warning("inside")
    logging.getLogger("ortserve.test").warning("outside")
    inside, outside = (json.loads(line) for line in captured.getvalue().splitlines())
    assert (inside["request_id"], inside["model"], inside["version"]) == ("req-7", "m", "2")
    assert "request_id" not in outside


def test_text_lines_end_with_the_request_tags(captured: io.StringIO) -> None:
    configure("text", captured)
    scope = Telemetry(ServerStatistics()).begin("http", "m", None, "abc", None)
    with scope.bound():
        logging.getLogger("ortserve.test").error("failed")
    assert captured.getvalue().rstrip().endswith("failed [request_id=abc model=m]")


def test_access_log_writes_one_line_per_request_only_when_on(captured: io.StringIO) -> None:
    configure("json", captured)
    Telemetry(ServerStatistics()).begin("http", "m", None, "quiet", None).finish(None, 200)
    assert captured.getvalue() == ""
    telemetry = Telemetry(ServerStatistics(), access_log=True)
    telemetry.begin("http", "m", "1", "loud", None).finish(InvalidInput("bad"), 400)
    (line,) = (json.loads(line) for line in captured.getvalue().splitlines())
    assert line["logger"] == "ortserve.access"
    assert line["request_id"] == "loud"
    assert "400 invalid" in line["message"]


@pytest.mark.e2e
def test_server_access_log_and_response_carry_the_request_id(tmp_path: Path) -> None:
    import urllib.request

    root = tmp_path / "models"
    write_demo_repository(root)
    args = ["--access-log", "--log-format", "json", "--grpc-port", "-1", "--metrics-port", "-1"]
    with run_server(root, tmp_path / "server.log", args) as server:
        body = json.dumps(
            {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}]}
        ).encode()
        request = urllib.request.Request(
            f"{server.http_url}/v2/models/small_mlp/infer", body, {"X-Request-ID": "trace-me-42"}
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            assert reply.headers["X-Request-ID"] == "trace-me-42"
            assert json.loads(reply.read())["id"] == "trace-me-42"
        server.stop()
        lines = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    access = [line for line in lines if line["logger"] == "ortserve.access"]
    assert len(access) == 1
    assert (access[0]["request_id"], access[0]["model"], access[0]["version"]) == (
        "trace-me-42",
        "small_mlp",
        "1",
    )


FORGED = "x\n2026-01-01 00:00:00,000 CRITICAL ortserve: forged\r\x1b[2J\u2028"


def test_text_log_keeps_each_record_on_one_line_whatever_the_client_sent(captured: io.StringIO) -> None:
    configure("text", captured)
    telemetry = Telemetry(ServerStatistics(), access_log=True)
    telemetry.begin("grpc", f"model{FORGED}", None, f"id{FORGED}", None).finish(InvalidInput(FORGED), 400)
    (line,) = captured.getvalue().splitlines()
    assert "idx\\x0a2026-01-01" in line and "\\x1b[2J\\u2028" in line
    assert 'model="modelx\\x0a' in line  # quoted: it holds spaces (logs.tag_value)


def test_text_log_tracebacks_are_indented_so_an_exception_message_cannot_start_a_line(
    captured: io.StringIO,
) -> None:
    configure("text", captured)
    try:
        raise ValueError(FORGED)
    except ValueError:
        logging.getLogger("ortserve.test").exception("failed with %s", FORGED)
    first, *rest = captured.getvalue().splitlines()
    assert first.endswith(
        "failed with x\\x0a2026-01-01 00:00:00,000 CRITICAL ortserve: forged\\x0d\\x1b[2J\\u2028"
    )
    assert rest and all(line.startswith("  | ") for line in rest)


def test_json_lines_escape_what_log_readers_break_lines_on(captured: io.StringIO) -> None:
    """C1 controls (NEL, CSI), U+2028/U+2029 and lone surrogates from a client's id: written
    as JSON escapes, so the entry stays one line to every reader and decodes back the same."""
    configure("json", captured)
    hostile = "id\x85next\x9b[31m\u2028\u2029\ud800 é"
    logging.getLogger("ortserve.test").warning("request %s", hostile)
    line = captured.getvalue()
    assert line.count("\n") == 1 and not any(c in line for c in "\x85\x9b\u2028\u2029\ud800")
    assert json.loads(line)["message"] == f"request {hostile}"
