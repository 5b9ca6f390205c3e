"""LangChain's ``ChatOpenAI`` (langchain-openai) and LiteLLM end to end against a real server on
the demo LM: plain and streamed answers equal to the server's own, tool calls parsed into the
declared arguments, structured output that validates. The clients come with the ``clients``
extra (``pip install -e '.[clients]'``, as CI installs it)."""

from __future__ import annotations

import importlib.util
import json
import os
import urllib.request
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel, Field

from ortserve.llm.demo import DEMO_LLM_NAME, write_demo_llm
from ortserve.testing import ServerProcess, run_server

pytestmark = [
    pytest.mark.e2e,
    # litellm's own import: pydantic's notice about a TypedDict of its OAuth code, not ours
    pytest.mark.filterwarnings("ignore:Items? .* the `ReadOnly` qualifier:UserWarning"),
]

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch from GitHub at import

_MISSING = [name for name in ("langchain_openai", "litellm") if importlib.util.find_spec(name) is None]
if _MISSING and os.environ.get("CI") == "true":
    raise RuntimeError(f"CI installs the clients extra: {', '.join(_MISSING)} missing")

_QUESTION = [{"role": "user", "content": "The lighthouse stood at the end of the long stone pier"}]
_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer"}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}


class Keeper(BaseModel):
    """A lighthouse keeper."""

    name: str = Field(max_length=10)
    years: int


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("llm_models")
    write_demo_llm(root)
    log = tmp_path_factory.mktemp("llm_logs") / "server.log"
    with run_server(root, log, ["--intra-op-threads", "1"]) as process:
        yield process


def _direct(server: ServerProcess, max_tokens: int) -> str:
    """The server's own greedy answer, asked without any client library."""
    body = {"model": DEMO_LLM_NAME, "messages": _QUESTION, "max_tokens": max_tokens, "temperature": 0}
    request = urllib.request.Request(
        f"{server.http_url}/v1/chat/completions", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        content: str = json.loads(reply.read())["choices"][0]["message"]["content"]
        return content


def _chat(server: ServerProcess, **options: Any) -> Any:
    langchain_openai = pytest.importorskip("langchain_openai")
    return langchain_openai.ChatOpenAI(
        model=DEMO_LLM_NAME,
        base_url=f"{server.http_url}/v1",
        api_key="unused",
        max_retries=0,
        timeout=60,
        **options,
    )


def test_langchain_invokes_and_streams_the_servers_answer(server: ServerProcess) -> None:
    expected = _direct(server, 16)
    chat = _chat(server, temperature=0, max_tokens=16)
    assert chat.invoke(_QUESTION).content == expected
    chunks = list(chat.stream(_QUESTION))
    assert len(chunks) > 3 and "".join(str(c.content) for c in chunks) == expected


def test_langchain_tool_calls_parse_into_the_declared_arguments(server: ServerProcess) -> None:
    chat = _chat(server, temperature=0, max_tokens=64)
    for choice in ("get_weather", "any"):
        message = chat.bind_tools([_WEATHER], tool_choice=choice, parallel_tool_calls=False).invoke(_QUESTION)
        assert [call["name"] for call in message.tool_calls] == ["get_weather"]
        jsonschema.validate(message.tool_calls[0]["args"], _WEATHER["function"]["parameters"])  # type: ignore[index]


def test_langchain_structured_output_is_the_pydantic_model(server: ServerProcess) -> None:
    chat = _chat(server, temperature=1.0, max_tokens=64, seed=3)
    keeper = chat.with_structured_output(Keeper, method="json_schema", strict=True).invoke(_QUESTION)
    assert isinstance(keeper, Keeper) and len(keeper.name) <= 10


def _litellm() -> Any:
    return pytest.importorskip("litellm")


def _base(server: ServerProcess) -> dict[str, Any]:
    return {"model": f"openai/{DEMO_LLM_NAME}", "api_base": f"{server.http_url}/v1", "api_key": "unused",
            "messages": _QUESTION, "timeout": 60, "num_retries": 0}  # fmt: skip


def test_litellm_completes_and_streams_the_servers_answer(server: ServerProcess) -> None:
    litellm = _litellm()
    expected = _direct(server, 16)
    reply = litellm.completion(**_base(server), temperature=0, max_tokens=16)
    assert reply.choices[0].message.content == expected and reply.usage.completion_tokens > 0
    pieces = [
        chunk.choices[0].delta.content or ""
        for chunk in litellm.completion(**_base(server), temperature=0, max_tokens=16, stream=True)
    ]
    assert len(pieces) > 3 and "".join(pieces) == expected


def test_litellm_tool_calls_and_json_schema(server: ServerProcess) -> None:
    litellm = _litellm()
    named = {"type": "function", "function": {"name": "get_weather"}}
    reply = litellm.completion(
        **_base(server), tools=[_WEATHER], tool_choice=named, max_tokens=64, temperature=0
    )
    calls = reply.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(calls[0].function.arguments), _WEATHER["function"]["parameters"])  # type: ignore[index]
    schema = Keeper.model_json_schema()
    schema["additionalProperties"] = False
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "keeper", "schema": schema, "strict": True},
    }
    reply = litellm.completion(**_base(server), response_format=response_format, max_tokens=64, seed=5)
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
