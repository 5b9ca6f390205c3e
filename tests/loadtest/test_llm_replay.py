"""``ortserve replay`` of a captured OpenAI conversation: chat requests (one streamed, one not)
reach the capture through the Exchange, and replaying the capture reports time to first token
and inter-token latency."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from ortserve.capture_records import CapturedRequest, read_capture
from ortserve.cli.main import main
from ortserve.llm.demo import DEMO_LLM_NAME, write_demo_llm
from ortserve.testing import ServerProcess, run_server
from waiting import wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def capturing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    root = tmp_path_factory.mktemp("llm_capture")
    write_demo_llm(root / "models")
    capture = root / "capture"
    args = [
        "--intra-op-threads",
        "1",
        "--capture-dir",
        str(capture),
        "--capture-rate",
        "1.0",
        "--grpc-port",
        "-1",
    ]
    with run_server(root / "models", root / "server.log", args) as server:
        yield server, capture


def _chat(server: ServerProcess, stream: bool) -> bytes:
    body = {
        "model": DEMO_LLM_NAME,
        "messages": [{"role": "user", "content": "The lighthouse stood at the end of the long stone pier"}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": stream,
    }
    connection = http.client.HTTPConnection(server.http_url.removeprefix("http://"), timeout=30)
    try:
        connection.request(
            "POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"}
        )
        reply = connection.getresponse()
        assert reply.status == 200
        return reply.read()
    finally:
        connection.close()


def _records(directory: Path, count: int) -> list[CapturedRequest]:
    def records() -> list[CapturedRequest] | None:  # the writer flushes in the background
        found = list(read_capture([directory])) if directory.exists() else []
        return found if len(found) >= count else None

    return wait_until(records, 30, f"{count} captured records")


def test_a_captured_conversation_replays_with_ttft_and_itl(
    capturing: tuple[ServerProcess, Path], tmp_path: Path
) -> None:
    server, capture = capturing
    assert b"data: [DONE]" in _chat(server, stream=True)
    assert b'"choices"' in _chat(server, stream=False)
    records = _records(capture, 2)
    assert [(r.path, r.model, r.status) for r in records] == [
        ("/v1/chat/completions", DEMO_LLM_NAME, 200)
    ] * 2
    assert [json.loads(r.body)["stream"] for r in records] == [True, False]

    kept = tmp_path / "capture"
    kept.mkdir()
    for file in capture.glob("*.ocap"):
        (kept / file.name).write_bytes(file.read_bytes())
    output = tmp_path / "replay.json"
    result = CliRunner().invoke(
        main, ["replay", str(kept), "--target", server.http_url, "--speed", "10", "--output", str(output)]
    )
    assert result.exit_code == 0, result.output
    assert "generation requests replayed: 2" in result.output and "ttft p50" in result.output
    level = json.loads(output.read_text())["generation"]
    assert (level["requests"], level["failures"]) == (2, 0)
    assert level["ttft_s"]["p50"] > 0 and level["itl_s"]["p50"] > 0 and level["output_tokens"] >= 8
