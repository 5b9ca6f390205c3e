"""End to end with the official ``openai`` client (sync, async, streaming) against a real server
serving the demo LLM; also Triton's generate extension and the generation metrics."""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from click.testing import CliRunner

from ortserve.cli.main import main
from ortserve.llm.demo import DEMO_LLM_NAME, corpus_documents, write_demo_llm
from ortserve.testing import ServerProcess, run_server
from waiting import wait_until

pytestmark = pytest.mark.e2e

_ONE_SLOT = "kind: llm\nintra_op_threads: 1\nllm:\n  max_num_seqs: 1\n  max_waiting: 1\n"


@pytest.fixture(scope="module")
def llm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("llm_models")
    write_demo_llm(root)
    shutil.copytree(root / DEMO_LLM_NAME / "1", root / "one_slot" / "1")
    (root / "one_slot" / "config.yaml").write_text(_ONE_SLOT)
    log = tmp_path_factory.mktemp("llm_logs") / "server.log"
    with run_server(root, log, ["--intra-op-threads", "1"]) as server:
        yield server


@pytest.fixture
def client(llm_server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{llm_server.http_url}/v1", api_key="unused", max_retries=0, timeout=30
    ) as opened:  # closed after the test: its pooled connections are sockets
        yield opened


_OPENING = "The lighthouse stood at the end of the long stone pier, and every evening the keeper"


def test_chat_completion_answers_with_usage(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=DEMO_LLM_NAME, messages=[{"role": "user", "content": _OPENING}], max_tokens=12, temperature=0
    )
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.message.content.strip().startswith("climbed the")  # the corpus continues
    assert choice.finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 12
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 12


def test_streaming_and_non_streaming_agree(client: openai.OpenAI) -> None:
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [
        {"role": "user", "content": "When many people ask questions at the same time"}
    ]
    whole = client.chat.completions.create(
        model=DEMO_LLM_NAME, messages=messages, max_tokens=30, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model=DEMO_LLM_NAME,
            messages=messages,
            max_tokens=30,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        whole.choices[0].finish_reason
    ]
    assert chunks[-1].usage is not None and whole.usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


async def test_async_client_completions_streaming_and_not(llm_server: ServerProcess) -> None:
    async with openai.AsyncOpenAI(
        base_url=f"{llm_server.http_url}/v1", api_key="unused", max_retries=0
    ) as aclient:
        whole = await aclient.completions.create(
            model=DEMO_LLM_NAME, prompt="The garden behind", max_tokens=20, temperature=0
        )
        stream = await aclient.completions.create(
            model=DEMO_LLM_NAME, prompt="The garden behind", max_tokens=20, temperature=0, stream=True
        )
        pieces = [chunk.choices[0].text async for chunk in stream if chunk.choices]
    assert whole.choices[0].text.strip().startswith("the house was full of apple trees")
    assert "".join(pieces) == whole.choices[0].text


def test_stop_strings_and_max_tokens(client: openai.OpenAI) -> None:
    stopped = client.completions.create(
        model=DEMO_LLM_NAME, prompt=_OPENING, max_tokens=40, temperature=0, stop=[" the"]
    )
    assert stopped.choices[0].text.strip() == "climbed" and stopped.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model=DEMO_LLM_NAME, prompt=_OPENING, max_tokens=40, temperature=0, stop=[" the"], stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices).strip() == "climbed"
    short = client.completions.create(model=DEMO_LLM_NAME, prompt=_OPENING, max_tokens=3, temperature=0)
    assert short.choices[0].finish_reason == "length" and short.usage is not None
    assert short.usage.completion_tokens == 3


def test_a_seed_makes_sampling_reproducible(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        reply = client.completions.create(
            model=DEMO_LLM_NAME, prompt="The", max_tokens=24, temperature=1.2, seed=seed
        )
        return reply.choices[0].text

    assert sample(11) == sample(11)
    assert len({sample(s) for s in range(5)}) > 1


def test_errors_come_in_openai_shape(client: openai.OpenAI, llm_server: ServerProcess) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="no_such_model", prompt="x")
    assert missing.value.status_code == 404
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=DEMO_LLM_NAME, prompt="x", temperature=5)
    body = bad.value.body
    assert (
        isinstance(body, dict)
        and "temperature" in body["message"]
        and body["type"] == "invalid_request_error"
    )
    request = urllib.request.Request(
        f"{llm_server.http_url}/v1/chat/completions", data=b"{not json", method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as raw:
        urllib.request.urlopen(request)
    with raw.value:  # the error holds the answer's socket
        assert raw.value.code == 400 and "error" in json.loads(raw.value.read())


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"prompt": [-1]}, "token ids must be in"),  # decoded before its range was checked: 500
        ({"prompt": [10**9]}, "token ids must be in"),
        ({"prompt": "x", "seed": -1}, "seed must be between"),  # NumPy refused the seed: 500
    ],
)
def test_out_of_range_token_ids_and_seeds_are_a_400(
    client: openai.OpenAI, fields: dict[str, object], message: str
) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=DEMO_LLM_NAME, max_tokens=2, **fields)  # type: ignore[call-overload]
    assert isinstance(bad.value.body, dict) and message in bad.value.body["message"]


def test_models_lists_the_generation_models(client: openai.OpenAI) -> None:
    assert {m.id for m in client.models.list()} == {DEMO_LLM_NAME, "one_slot"}


def _metric(server: ServerProcess, name: str, model: str) -> float:
    with urllib.request.urlopen(f"{server.http_url}/metrics") as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(name + "{") and f'model="{model}"' in line:
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} for {model} not exported")


def test_a_client_that_disconnects_frees_its_slot(client: openai.OpenAI, llm_server: ServerProcess) -> None:
    before = _metric(llm_server, "ortserve_llm_generation_tokens_total", "one_slot")
    stream = client.completions.create(
        model="one_slot",
        prompt="The",
        max_tokens=2000,
        temperature=1.0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    next(iter(stream))
    stream.close()
    wait_until(
        lambda: _metric(llm_server, "ortserve_llm_running_sequences", "one_slot") == 0, 20, "the slot freed"
    )
    # It was cut short, not run to its 2,000 tokens; and the one place is free for the next.
    assert _metric(llm_server, "ortserve_llm_generation_tokens_total", "one_slot") - before < 2000
    reply = client.completions.create(model="one_slot", prompt="The river", max_tokens=5, temperature=0)
    assert reply.usage is not None and reply.usage.completion_tokens == 5


def test_beyond_the_queue_bound_requests_get_429_with_retry_after(
    client: openai.OpenAI, llm_server: ServerProcess
) -> None:
    def long() -> openai.Stream[openai.types.Completion]:
        return client.completions.create(
            model="one_slot", prompt="The", max_tokens=2000, stream=True, extra_body={"ignore_eos": True}
        )

    running = long()
    next(iter(running))
    waiting = long()  # holds the one waiting place (its head comes once it runs)
    try:
        wait_until(
            lambda: _metric(llm_server, "ortserve_llm_waiting_sequences", "one_slot") == 1, 20, "one waiting"
        )
        with pytest.raises(openai.RateLimitError) as refused:
            client.completions.create(model="one_slot", prompt="The", max_tokens=2)
        assert int(refused.value.response.headers["retry-after"]) >= 1
    finally:
        running.close()
        waiting.close()


def _post(server: ServerProcess, path: str, body: dict[str, object]) -> bytes:
    request = urllib.request.Request(
        f"{server.http_url}{path}", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return bytes(reply.read())


def test_the_generate_extension_answers_and_streams(llm_server: ServerProcess) -> None:
    body: dict[str, object] = {
        "text_input": "The river runs",
        "parameters": {"max_tokens": 16, "temperature": 0},
    }
    whole = json.loads(_post(llm_server, f"/v2/models/{DEMO_LLM_NAME}/generate", body))
    assert whole["model_name"] == DEMO_LLM_NAME and whole["text_output"].strip().startswith(
        "through the old town"
    )
    events = _post(llm_server, f"/v2/models/{DEMO_LLM_NAME}/versions/1/generate_stream", body).decode()
    pieces = [json.loads(line[6:]) for line in events.splitlines() if line.startswith("data: ")]
    assert "".join(p["text_output"] for p in pieces) == whole["text_output"]
    assert pieces[-1]["finish_reason"] == whole["finish_reason"]


def test_generation_metrics_are_exported(client: openai.OpenAI, llm_server: ServerProcess) -> None:
    history = corpus_documents()[6]
    first = client.completions.create(model=DEMO_LLM_NAME, prompt=history, max_tokens=4, temperature=0)
    second = client.completions.create(
        model=DEMO_LLM_NAME, prompt=history + first.choices[0].text, max_tokens=4
    )
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    assert (second.usage.prompt_tokens_details.cached_tokens or 0) > 0
    # A whole paragraph may end in the end-of-text token at once (no token, no time to first
    # token); this prompt goes on, so the token latencies are observed whatever ran before.
    going_on = client.completions.create(
        model=DEMO_LLM_NAME, prompt="The river runs", max_tokens=4, temperature=0
    )
    assert going_on.choices[0].text.strip()
    for name in (
        "ortserve_llm_time_to_first_token_seconds_count",
        "ortserve_llm_inter_token_latency_seconds_count",
        "ortserve_llm_e2e_request_seconds_count",
        "ortserve_llm_prompt_tokens_total",
        "ortserve_llm_cached_prompt_tokens_total",
        "ortserve_llm_prefix_cache_hit_ratio",
        "ortserve_llm_engine_steps_total",
    ):
        assert _metric(llm_server, name, DEMO_LLM_NAME) > 0, name
    assert _metric(llm_server, "ortserve_llm_kv_cache_bytes", DEMO_LLM_NAME) > 0
    # Time inside ONNX Runtime is part of the steps' time, the rest is the engine's own cost.
    in_model = _metric(llm_server, "ortserve_llm_model_run_seconds_total", DEMO_LLM_NAME)
    assert 0 < in_model <= _metric(llm_server, "ortserve_llm_engine_step_seconds_total", DEMO_LLM_NAME)
    steps = _metric(llm_server, "ortserve_llm_engine_steps_total", DEMO_LLM_NAME)
    assert 0 <= _metric(llm_server, "ortserve_llm_engine_fused_steps_total", DEMO_LLM_NAME) <= steps


def test_bench_openai_transport_reports_tokens_and_latencies(
    llm_server: ServerProcess, tmp_path: Path
) -> None:
    output = tmp_path / "llm.json"
    args = ["bench", llm_server.http_url, "--transport", "openai", "-m", DEMO_LLM_NAME, "-c", "1,3", "-d", "1.5",
            "--warmup", "0.2", "--prompt-tokens", "20", "--max-tokens", "8", "-o", str(output)]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "tok/s" in result.output
    levels = json.loads(output.read_text())["levels"]
    assert [level["concurrency"] for level in levels] == [1, 3]
    for level in levels:
        assert level["failures"] == 0 and level["requests"] > 0 and level["output_tokens_per_s"] > 0
        assert 0 < level["ttft_s"]["p50"] <= level["e2e_s"]["p50"] and level["itl_s"]["p99"] > 0
    missed = CliRunner().invoke(main, [*args[:-2], "--slo", "p50=1us"])
    assert missed.exit_code == 3 and "MISSED" in missed.output


def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(client: openai.OpenAI) -> None:
    """vLLM's stream_options.continuous_usage_stats (guidellm sends it): the counts grow chunk by
    chunk and the last usage equals the answer's."""
    chunks = list(
        client.chat.completions.create(
            model=DEMO_LLM_NAME,
            messages=[{"role": "user", "content": _OPENING}],
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        )
    )
    counts = [c.usage.completion_tokens for c in chunks if c.usage is not None]
    assert len(counts) == len(chunks) and counts == sorted(counts)
    # the first chunk (the role) counts what was generated when it was written: 0, or 1 when the
    # first token came before the loop wrote it (a busy machine)
    assert counts[0] <= 1 and counts[-1] == 12 and len(set(counts)) > 5
    assert all(c.usage is not None and c.usage.prompt_tokens == chunks[0].usage.prompt_tokens for c in chunks)  # type: ignore[union-attr]
