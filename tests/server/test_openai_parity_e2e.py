"""OpenAI parity against a real server serving the demo LLM, through the official client:
refused fields name themselves, and every honoured parameter has its effect on the output."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from tokenizers import Tokenizer

from ortserve.llm.demo import DEMO_LLM_NAME, write_demo_llm
from ortserve.testing import ServerProcess, run_server

pytestmark = pytest.mark.e2e

_PROMPT = "The lighthouse stood at the end of the long stone pier, and every evening the keeper"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("llm_models")
    write_demo_llm(root)
    return root


@pytest.fixture(scope="module")
def tokenizer(models: Path) -> Tokenizer:
    return Tokenizer.from_file(str(models / DEMO_LLM_NAME / "1" / "tokenizer.json"))


@pytest.fixture(scope="module")
def llm_server(models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = models
    log = tmp_path_factory.mktemp("llm_logs") / "server.log"
    with run_server(root, log, ["--intra-op-threads", "1"]) as server:
        yield server


@pytest.fixture
def client(llm_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{llm_server.http_url}/v1", api_key="unused", max_retries=0, timeout=30)


def _post(server: ServerProcess, path: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        f"{server.http_url}{path}", data=json.dumps(body).encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/v1/chat/completions", "frobnicate", 1),
        ("/v1/chat/completions", "audio", {"voice": "alloy", "format": "wav"}),
        ("/v1/chat/completions", "functions", [{"name": "f", "parameters": {}}]),
        ("/v1/completions", "suffix", "end"),
        ("/v1/completions", "messages", []),
    ],
)
def test_a_field_that_is_not_honoured_is_a_400_naming_it(
    llm_server: ServerProcess, path: str, field: str, value: object
) -> None:
    body: dict[str, object] = {"model": DEMO_LLM_NAME, "max_tokens": 2, field: value}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"})
    status, answer = _post(llm_server, path, body)
    error = answer["error"]
    assert status == 400 and isinstance(error, dict)
    assert error["param"] == field and field in error["message"] and error["type"] == "invalid_request_error"


def test_informational_fields_are_accepted(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=DEMO_LLM_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=2, user="u1",
        metadata={"team": "a"}, store=False, service_tier="auto",
    )  # fmt: skip
    assert reply.choices[0].finish_reason in ("length", "stop")


def test_stop_token_ids_end_the_answer_at_that_token(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    free = client.completions.create(model=DEMO_LLM_NAME, prompt=_PROMPT, max_tokens=8, temperature=0)
    tokens = tokenizer.encode(_PROMPT + free.choices[0].text, add_special_tokens=False).ids
    third = tokens[len(tokenizer.encode(_PROMPT, add_special_tokens=False).ids) + 2]
    stopped = client.completions.create(
        model=DEMO_LLM_NAME,
        prompt=_PROMPT,
        max_tokens=8,
        temperature=0,
        extra_body={"stop_token_ids": [third]},
    )
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage is not None
    assert stopped.usage.completion_tokens < 8 and free.choices[0].text.startswith(stopped.choices[0].text)


def test_health_answers_200_when_ready(llm_server: ServerProcess) -> None:
    with urllib.request.urlopen(f"{llm_server.http_url}/health", timeout=10) as reply:
        assert reply.status == 200 and reply.read() == b""


def test_tokenize_and_detokenize_round_trip_in_vllm_shapes(
    llm_server: ServerProcess, tokenizer: Tokenizer
) -> None:
    status, answer = _post(llm_server, "/tokenize", {"model": DEMO_LLM_NAME, "prompt": _PROMPT})
    expected = tokenizer.encode(_PROMPT).ids
    assert status == 200 and answer["tokens"] == expected and answer["count"] == len(expected)
    assert isinstance(answer["max_model_len"], int) and answer["token_strs"] is None
    status, back = _post(llm_server, "/detokenize", {"model": DEMO_LLM_NAME, "tokens": expected})
    assert status == 200 and back == {"prompt": _PROMPT}
    # vLLM's clients send no model when one LLM is served; token strings read as in the text
    status, answer = _post(llm_server, "/tokenize", {"prompt": "The river", "return_token_strs": True})
    assert status == 200 and "".join(answer["token_strs"]).strip() == "The river"  # type: ignore[arg-type]


def test_tokenize_renders_chat_messages_through_the_template(llm_server: ServerProcess) -> None:
    messages = [{"role": "user", "content": "The garden behind"}]
    status, chat = _post(llm_server, "/tokenize", {"model": DEMO_LLM_NAME, "messages": messages})
    _, plain = _post(
        llm_server,
        "/tokenize",
        {"model": DEMO_LLM_NAME, "prompt": "The garden behind", "add_special_tokens": False},
    )
    assert status == 200 and chat["tokens"] == plain["tokens"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {"prompt": "x", "truncate": 3}, "truncate"),
        ("/tokenize", {"prompt": 3}, "prompt"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
    ],
)
def test_tokenize_routes_refuse_bad_fields_by_name(
    llm_server: ServerProcess, path: str, body: dict[str, object], param: str
) -> None:
    status, answer = _post(llm_server, path, body)
    assert status == 400 and answer["error"]["param"] == param  # type: ignore[index]
