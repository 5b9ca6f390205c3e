"""End to end: a burst beyond what the demo LLM can start within its max_queue_wait_s gets 429s
with Retry-After in OpenAI's error shape at once, and every admitted request completes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import pytest

from ortserve.llm.demo import DEMO_LLM_NAME, write_demo_llm
from ortserve.testing import ServerProcess, run_server

pytestmark = pytest.mark.e2e

_CONFIG = "kind: llm\nintra_op_threads: 1\nllm:\n  max_num_seqs: 4\n  max_waiting: 1000\n  max_queue_wait_s: 0.001\n"


@pytest.fixture(scope="module")
def llm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("queue_models")
    write_demo_llm(root)
    (root / DEMO_LLM_NAME / "config.yaml").write_text(_CONFIG)
    log = tmp_path_factory.mktemp("queue_logs") / "server.log"
    with run_server(root, log, ["--intra-op-threads", "1"]) as server:
        yield server


async def test_a_burst_gets_429_with_retry_after_and_the_admitted_complete(llm_server: ServerProcess) -> None:
    client = openai.AsyncOpenAI(base_url=f"{llm_server.http_url}/v1", api_key="k", max_retries=0, timeout=60)

    async def one(index: int) -> tuple[str, str | None]:
        try:
            answer = await client.completions.create(
                model=DEMO_LLM_NAME, prompt=f"The lighthouse keeper {index}", max_tokens=8, temperature=0
            )
        except openai.RateLimitError as refused:
            assert refused.body is not None and "message" in refused.body  # type: ignore[operator]
            return "429", refused.response.headers.get("retry-after")
        return "200", answer.choices[0].finish_reason

    try:
        outcomes = await asyncio.gather(*(one(i) for i in range(40)))
    finally:
        await client.close()
    refused = [retry for status, retry in outcomes if status == "429"]
    served = [reason for status, reason in outcomes if status == "200"]
    assert refused and all(retry is not None and float(retry) >= 1 for retry in refused)
    assert served and all(reason in ("stop", "length") for reason in served)
