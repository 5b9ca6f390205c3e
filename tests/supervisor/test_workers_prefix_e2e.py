"""With ``--workers 2``, every follow-up turn of a conversation finds its history in the prefix
cache, whichever worker the kernel hands its connection to: completions and chat, whole and
streamed answers (each turn on a new connection; without routing each follow-up would miss
half the time, so all 8 hitting by chance has odds of 1 in 256)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from ortserve.llm.demo import DEMO_LLM_NAME, write_demo_llm
from ortserve.testing import ServerProcess, run_server
from workers_helpers import scrape, value, wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("prefix_models")
    write_demo_llm(root)
    log = tmp_path_factory.mktemp("prefix_logs") / "server.log"
    with run_server(root, log, ["--workers", "2", "--intra-op-threads", "1"]) as server:
        # ready once one worker is: wait for both (the merged state is ready only then)
        wait_until(
            lambda: (
                value(scrape(server), "ortserve_model_state", model=DEMO_LLM_NAME, version="1", state="ready")
                == 1
            ),
            what="the model ready on both workers",
        )
        yield server


def _post(server: ServerProcess, path: str, body: dict[str, Any]) -> tuple[str, int]:
    """(the text, the cached prompt tokens) of one request on a new connection."""
    connection = http.client.HTTPConnection(server.host, server.http_port, timeout=60)
    try:
        headers = {"Connection": "close", "content-type": "application/json"}
        connection.request(
            "POST", path, json.dumps({"model": DEMO_LLM_NAME, "temperature": 0, **body}), headers
        )
        reply = connection.getresponse()
        data = reply.read()
    finally:
        connection.close()
    assert reply.status == 200, data
    if not body.get("stream"):
        answer = json.loads(data)
        choice = answer["choices"][0]
        text = choice["text"] if "text" in choice else choice["message"]["content"]
        return text, int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])
    events = [json.loads(line[6:]) for line in data.decode().split("\n") if line.startswith("data: {")]
    text = "".join(
        c["text"] if "text" in c else c["delta"].get("content") or "" for e in events for c in e["choices"]
    )
    assert data.rstrip().endswith(b"data: [DONE]")
    return text, int(events[-1]["usage"]["prompt_tokens_details"]["cached_tokens"])


@pytest.mark.parametrize("stream", [False, True])
def test_every_completion_follow_up_hits_the_cached_prefix(workers: ServerProcess, stream: bool) -> None:
    for index in range(4):
        prompt = f"Log {index}, stream {stream}: the keeper of the lighthouse wrote about the ships at sea"
        options = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
        reply, _ = _post(workers, "/v1/completions", {"prompt": prompt, "max_tokens": 8, **options})
        _, cached = _post(
            workers, "/v1/completions", {"prompt": prompt + reply + " and", "max_tokens": 2, **options}
        )
        assert cached >= 16, (index, cached)


def test_every_chat_follow_up_hits_the_cached_prefix(workers: ServerProcess) -> None:
    for index in range(4):
        messages = [
            {"role": "system", "content": "You are the keeper of a lighthouse; answer briefly."},
            {"role": "user", "content": f"Question {index}: what did the ships at sea signal tonight?"},
        ]
        reply, _ = _post(workers, "/v1/chat/completions", {"messages": messages, "max_tokens": 8})
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And then?"}]
        _, cached = _post(workers, "/v1/chat/completions", {"messages": messages, "max_tokens": 2})
        assert cached >= 16, (index, cached)


@pytest.mark.parametrize("last", ["generate", "generate_stream"])
def test_every_generate_follow_up_hits_the_cached_prefix(workers: ServerProcess, last: str) -> None:
    # OIP's generate routes are routed by their text_input as completions are by their prompt.
    path = f"/v2/models/{DEMO_LLM_NAME}/{last}"
    for index in range(4):
        prompt = f"Entry {index} via {last}: the keeper of the lighthouse wrote about the ships at sea"
        reply, _ = _generate(workers, path, prompt, 8)
        _, cached = _generate(workers, path, prompt + reply + " and", 2)
        assert cached >= 16, (index, cached)


def _generate(server: ServerProcess, path: str, text: str, max_tokens: int) -> tuple[str, int]:
    """(the text, the cached prompt tokens) of one generate request on a new connection."""
    connection = http.client.HTTPConnection(server.host, server.http_port, timeout=60)
    try:
        body = {"text_input": text, "parameters": {"max_tokens": max_tokens, "temperature": 0}}
        connection.request(
            "POST", path, json.dumps(body), {"Connection": "close", "content-type": "application/json"}
        )
        reply = connection.getresponse()
        data = reply.read()
    finally:
        connection.close()
    assert reply.status == 200, data
    if path.endswith("/generate"):
        answer = json.loads(data)
        return answer["text_output"], int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])
    events = [json.loads(line[6:]) for line in data.decode().split("\n") if line.startswith("data: {")]
    return "".join(e["text_output"] for e in events), int(
        events[-1]["usage"]["prompt_tokens_details"]["cached_tokens"]
    )
