"""OpenAI parity against a real server serving the demo LLM, through the official client:
refused fields name themselves, and every honoured parameter has its effect on the output."""

from __future__ import annotations

import json
import random
import re
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import openai
import pydantic
import pytest
from tokenizers import Tokenizer

from ortserve.llm.demo import DEMO_LLM_NAME, write_demo_llm
from ortserve.testing import ServerProcess, run_server

pytestmark = pytest.mark.e2e

_TOOL_TEMPLATE = (
    "{% if tools %}Tools:{% for t in tools %} {{ t.function.name }}{% endfor %}\n{% endif %}"
    "{% if shout %}LOUD\n{% endif %}"
    "{% for m in messages %}{{ m.content }}{% endfor %}"
)
_PROMPT = "The lighthouse stood at the end of the long stone pier, and every evening the keeper"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("llm_models")
    write_demo_llm(root)
    # the same model with a template that renders the tools and a chat_template_kwargs flag
    shutil.copytree(root / DEMO_LLM_NAME, root / "tool_llm")
    config_path = root / "tool_llm" / "1" / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = _TOOL_TEMPLATE
    config_path.write_text(json.dumps(config))
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
    status, answer = _post(llm_server, "/v1/embeddings", {"model": DEMO_LLM_NAME, "input": "x"})
    assert status == 404 and "not an embedding model" in answer["error"]["message"]  # type: ignore[index]


def test_tokenize_and_detokenize_round_trip_in_vllm_shapes(
    llm_server: ServerProcess, tokenizer: Tokenizer
) -> None:
    status, answer = _post(llm_server, "/tokenize", {"model": DEMO_LLM_NAME, "prompt": _PROMPT})
    expected = tokenizer.encode(_PROMPT).ids
    assert status == 200 and answer["tokens"] == expected and answer["count"] == len(expected)
    assert isinstance(answer["max_model_len"], int) and answer["token_strs"] is None
    status, back = _post(llm_server, "/detokenize", {"model": DEMO_LLM_NAME, "tokens": expected})
    assert status == 200 and back == {"prompt": _PROMPT}
    # token strings read as in the text; no model with two LLMs served is refused naming it
    ask = {"model": DEMO_LLM_NAME, "prompt": "The river", "return_token_strs": True}
    status, answer = _post(llm_server, "/tokenize", ask)
    assert status == 200 and "".join(answer["token_strs"]).strip() == "The river"  # type: ignore[arg-type]
    status, answer = _post(llm_server, "/tokenize", {"prompt": "x"})  # two LLMs here: which one?
    assert status == 400 and answer["error"]["param"] == "model"  # type: ignore[index]


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
        ("/tokenize", {"model": DEMO_LLM_NAME, "prompt": "x", "truncate": 3}, "truncate"),
        ("/tokenize", {"model": DEMO_LLM_NAME, "prompt": 3}, "prompt"),
        ("/detokenize", {"model": DEMO_LLM_NAME, "tokens": [10**9]}, "tokens"),
        ("/detokenize", {"model": DEMO_LLM_NAME, "tokens": "abc"}, "tokens"),
    ],
)
def test_tokenize_routes_refuse_bad_fields_by_name(
    llm_server: ServerProcess, path: str, body: dict[str, object], param: str
) -> None:
    status, answer = _post(llm_server, path, body)
    assert status == 400 and answer["error"]["param"] == param  # type: ignore[index]


def _model_logprobs(models: Path, prompt: list[int]) -> npt.NDArray[np.float64]:
    """log_softmax of the demo model's next-token logits after ``prompt``, run here by ORT."""
    folder = models / DEMO_LLM_NAME / "1"
    config = json.loads((folder / "config.json").read_text())
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    ids = np.array([prompt], dtype=np.int64)
    feeds: dict[str, object] = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    names = {i.name for i in session.get_inputs()}
    if "position_ids" in names:
        feeds["position_ids"] = np.arange(len(prompt), dtype=np.int64)[None]
    empty = np.zeros((1, config["num_key_value_heads"], 0, config["head_dim"]), dtype=np.float32)
    feeds.update({name: empty for name in names if name.startswith("past_key_values")})
    if "use_cache_branch" in names:
        feeds["use_cache_branch"] = np.array([False])
    logits = session.run(None, feeds)[0][0, -1].astype(np.float64)
    top = logits.max()
    result: npt.NDArray[np.float64] = logits - top - np.log(np.exp(logits - top).sum())
    return result


def test_logprobs_are_the_models_log_softmax_for_the_chosen_token(
    client: openai.OpenAI, models: Path, tokenizer: Tokenizer
) -> None:
    reply = client.completions.create(
        model=DEMO_LLM_NAME, prompt=_PROMPT, max_tokens=1, temperature=0.8, seed=3, logprobs=3
    )
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.token_logprobs and logprobs.top_logprobs
    reference = _model_logprobs(models, tokenizer.encode(_PROMPT).ids)
    chosen = tokenizer.encode(_PROMPT + reply.choices[0].text).ids[-1]
    assert logprobs.token_logprobs[0] == pytest.approx(reference[chosen], abs=1e-4)
    best = np.argsort(-reference)[:3]
    assert list(logprobs.top_logprobs[0].values()) == pytest.approx(reference[best].tolist(), abs=1e-4)
    assert logprobs.text_offset == [0] and "".join(logprobs.tokens or []) == reply.choices[0].text


def test_chat_logprobs_streamed_equal_the_whole_answers(client: openai.OpenAI) -> None:
    ask: dict[str, object] = {
        "model": DEMO_LLM_NAME, "messages": [{"role": "user", "content": _PROMPT}], "max_tokens": 10,
        "temperature": 0, "logprobs": True, "top_logprobs": 2,
    }  # fmt: skip
    whole = client.chat.completions.create(**ask)  # type: ignore[call-overload]
    content = whole.choices[0].logprobs.content
    assert len(content) == 10 and all(len(t.top_logprobs) == 2 for t in content)
    assert "".join(t.token for t in content) == whole.choices[0].message.content
    assert all(t.logprob == pytest.approx(t.top_logprobs[0].logprob) for t in content)  # greedy: the best
    streamed = [
        t for c in client.chat.completions.create(**ask, stream=True)  # type: ignore[call-overload]
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content or []
    ]  # fmt: skip
    assert [(t.token, round(t.logprob, 5)) for t in streamed] == [
        (t.token, round(t.logprob, 5)) for t in content
    ]


def test_a_logit_bias_of_100_makes_its_token_come_out(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    token = tokenizer.token_to_id("▁lighthouse") or tokenizer.encode(" lighthouse").ids[-1]
    reply = client.completions.create(
        model=DEMO_LLM_NAME, prompt="The garden", max_tokens=5, temperature=1.0, logprobs=0,
        logit_bias={str(token): 100}, seed=1,
    )  # fmt: skip
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert len(set(logprobs.tokens)) == 1 and len(logprobs.tokens) == 5
    assert tokenizer.encode("The garden" + logprobs.tokens[0]).ids[-1] == token


def test_n_choices_are_greedy_equal_or_seeded_like_single_requests(client: openai.OpenAI) -> None:
    greedy = client.completions.create(model=DEMO_LLM_NAME, prompt=_PROMPT, max_tokens=8, temperature=0, n=3)
    assert [c.index for c in greedy.choices] == [0, 1, 2] and len({c.text for c in greedy.choices}) == 1
    assert greedy.usage is not None and greedy.usage.completion_tokens == 24
    seeded = client.completions.create(
        model=DEMO_LLM_NAME, prompt="The", max_tokens=12, temperature=1.5, n=3, seed=7
    )
    singles = [
        client.completions.create(
            model=DEMO_LLM_NAME, prompt="The", max_tokens=12, temperature=1.5, seed=7 + i
        )
        for i in range(3)
    ]
    assert [c.text for c in seeded.choices] == [s.choices[0].text for s in singles]
    chat = client.chat.completions.create(
        model=DEMO_LLM_NAME, messages=[{"role": "user", "content": "The"}], max_tokens=6, n=2, stream=True
    )
    texts = ["", ""]
    for chunk in chat:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert all(texts)


def test_best_of_returns_the_most_likely_of_its_candidates(client: openai.OpenAI) -> None:
    ask: dict[str, object] = {"model": DEMO_LLM_NAME, "prompt": "The", "max_tokens": 6, "temperature": 1.5}
    picked = set()
    for base in (20, 30, 40, 50):  # the best is not always the first candidate
        best = client.completions.create(**ask, best_of=3, seed=base)  # type: ignore[call-overload]
        candidates = [client.completions.create(**ask, seed=base + i, logprobs=0) for i in range(3)]  # type: ignore[call-overload]
        scores = [sum(c.choices[0].logprobs.token_logprobs) for c in candidates]
        assert len(best.choices) == 1 and best.choices[0].logprobs is None
        assert best.choices[0].text == candidates[scores.index(max(scores))].choices[0].text
        picked.add(scores.index(max(scores)))
    assert picked != {0}


def _random_schema(rng: random.Random, depth: int = 0) -> dict[str, object]:
    """A small JSON schema the demo model can fill within its max_tokens (bounded strings and arrays)."""
    kinds = ["string", "integer", "boolean", "enum", "array", "number"] + (["object"] if depth < 1 else [])
    kind = rng.choice(kinds)
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(1, 8)}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", "tide", "pier"], rng.randint(1, 3))}
    if kind == "array":
        return {"type": "array", "items": _random_schema(rng, depth + 1), "maxItems": rng.randint(0, 3)}
    if kind == "object":
        return _random_object(rng, depth + 1)
    return {"type": kind}


def _random_object(rng: random.Random, depth: int = 0) -> dict[str, object]:
    names = rng.sample(["name", "count", "tags", "ok", "where", "size", "kind_of"], rng.randint(1, 3))
    properties = {n: _random_schema(rng, depth) for n in names}
    required = [n for n in names if rng.random() < 0.7]
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def test_every_json_schema_answer_parses_and_validates(client: openai.OpenAI) -> None:
    rng = random.Random(29)
    for index in range(8):
        schema = _random_object(rng)
        reply = client.chat.completions.create(
            model=DEMO_LLM_NAME, messages=[{"role": "user", "content": "The garden"}], max_tokens=160,
            temperature=1.0, seed=index,
            response_format={"type": "json_schema", "json_schema": {"name": f"s{index}", "schema": schema, "strict": True}},
        )  # fmt: skip
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", (schema, choice.message.content)
        jsonschema.validate(json.loads(choice.message.content or ""), schema)


def test_json_object_and_regex_formats_constrain_the_answer(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=DEMO_LLM_NAME, messages=[{"role": "user", "content": "The river"}], max_tokens=120,
        temperature=0.8, seed=2, response_format={"type": "json_object"},
    )  # fmt: skip
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)
    else:  # an open object may run to max_tokens; what came is still the start of one
        assert (reply.choices[0].message.content or "").startswith("{")
    regex = client.chat.completions.create(
        model=DEMO_LLM_NAME, messages=[{"role": "user", "content": "The river"}], max_tokens=20, temperature=1.0,
        extra_body={"response_format": {"type": "regex", "regex": "(yes|no) [0-9]{3}"}},
    )  # fmt: skip
    assert re.fullmatch(r"(yes|no) [0-9]{3}", regex.choices[0].message.content or "")


class _Harbour(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=10)
    boats: int
    open: bool


def test_the_official_clients_parse_helper_gets_a_valid_model(client: openai.OpenAI) -> None:
    completion = client.beta.chat.completions.parse(
        model=DEMO_LLM_NAME, messages=[{"role": "user", "content": "Describe the harbour"}], max_tokens=80,
        temperature=0.7, seed=4, response_format=_Harbour,
    )  # fmt: skip
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, _Harbour) and len(parsed.name) <= 10


def test_a_schema_that_cannot_be_compiled_is_a_400_naming_response_format(llm_server: ServerProcess) -> None:
    body: dict[str, object] = {"model": DEMO_LLM_NAME, "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "frob"}}}}  # fmt: skip
    status, answer = _post(llm_server, "/v1/chat/completions", body)
    assert status == 400 and answer["error"]["param"] == "response_format"  # type: ignore[index]
    status, answer = _post(llm_server, "/v1/chat/completions", {**body, "response_format": {"type": "xml"}})
    assert status == 400 and answer["error"]["param"] == "response_format"  # type: ignore[index]


_WEATHER: dict[str, object] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer"}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
_TIME: dict[str, object] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 4}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


def test_a_required_tool_call_parses_into_the_declared_arguments(client: openai.OpenAI) -> None:
    parameters = _WEATHER["function"]["parameters"]  # type: ignore[index]
    for seed in range(3):
        reply = client.chat.completions.create(  # type: ignore[call-overload]
            model=DEMO_LLM_NAME, messages=[{"role": "user", "content": "Weather?"}], max_tokens=80,
            temperature=1.0, seed=seed, tools=[_WEATHER], tool_choice="required", parallel_tool_calls=False,
        )  # fmt: skip
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        call = choice.message.tool_calls[0]
        assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), parameters)


def test_a_named_tool_choice_calls_that_function_and_streams_openai_deltas(client: openai.OpenAI) -> None:
    ask: dict[str, object] = {
        "model": DEMO_LLM_NAME, "messages": [{"role": "user", "content": "Time?"}], "max_tokens": 60,
        "temperature": 0.5, "seed": 1, "tools": [_WEATHER, _TIME],
        "tool_choice": {"type": "function", "function": {"name": "get_time"}},
    }  # fmt: skip
    whole = client.chat.completions.create(**ask)  # type: ignore[call-overload]
    calls = whole.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_time"]
    assert isinstance(json.loads(calls[0].function.arguments), dict)
    names, arguments, finishes = [], "", []
    for chunk in client.chat.completions.create(**ask, stream=True):  # type: ignore[call-overload]
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                names += [delta.function.name] if delta.function and delta.function.name else []
                arguments += delta.function.arguments or "" if delta.function else ""
            finishes += [choice.finish_reason] if choice.finish_reason else []
    assert names == ["get_time"] and finishes == ["tool_calls"]
    assert arguments == calls[0].function.arguments


def test_auto_tool_choice_answers_in_text_when_the_model_calls_nothing(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=DEMO_LLM_NAME, messages=[{"role": "user", "content": _PROMPT}], max_tokens=8, temperature=0,
        tools=[_WEATHER],  # type: ignore[list-item]
    )  # fmt: skip
    assert reply.choices[0].message.content and not reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "length"


def test_tools_and_chat_template_kwargs_reach_the_chat_template(llm_server: ServerProcess) -> None:
    ask: dict[str, object] = {"model": "tool_llm", "messages": [{"role": "user", "content": "Hello"}], "tools": [_WEATHER, _TIME],
           "chat_template_kwargs": {"shout": True}}  # fmt: skip
    status, tokens = _post(llm_server, "/tokenize", ask)
    assert status == 200
    _, text = _post(llm_server, "/detokenize", {"model": "tool_llm", "tokens": tokens["tokens"]})
    # (the demo's vocabulary has no newline, and splits words at its added characters)
    assert str(text["prompt"]).replace(" ", "") == "Tools:get_weatherget_timeLOUDHello"
    status, answer = _post(
        llm_server, "/v1/chat/completions", {**ask, "max_tokens": 2, "chat_template_kwargs": ["x"]}
    )
    assert status == 400 and answer["error"]["param"] == "chat_template_kwargs"  # type: ignore[index]


def test_the_responses_api_answers_through_the_official_client(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=DEMO_LLM_NAME, input=_PROMPT, max_output_tokens=12, temperature=0, store=False
    )
    chat = client.chat.completions.create(
        model=DEMO_LLM_NAME, messages=[{"role": "user", "content": _PROMPT}], max_tokens=12, temperature=0
    )
    assert response.output_text == chat.choices[0].message.content
    assert response.status == "incomplete" and response.usage is not None
    assert response.usage.output_tokens == 12
    events = list(
        client.responses.create(
            model=DEMO_LLM_NAME, input=_PROMPT, max_output_tokens=12, temperature=0, stream=True
        )
    )
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == response.output_text
    assert [e.type for e in events][:2] == ["response.created", "response.in_progress"]
    final = events[-1]
    assert final.type == "response.incomplete" and final.response.output_text == response.output_text
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}  # fmt: skip
    shaped = client.responses.create(
        model=DEMO_LLM_NAME, input=[{"role": "user", "content": "Is it open?"}], max_output_tokens=20,
        text={"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}},
    )  # fmt: skip
    assert isinstance(json.loads(shaped.output_text)["ok"], bool)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=DEMO_LLM_NAME, input="x", previous_response_id="resp_1")
    assert isinstance(refused.value.body, dict) and refused.value.body["param"] == "previous_response_id"


def test_the_responses_api_calls_function_tools_and_takes_their_output_back(client: openai.OpenAI) -> None:
    function = _WEATHER["function"]
    tool = {"type": "function", "name": "get_weather", "parameters": function["parameters"]}  # type: ignore[index]
    called = client.responses.create(  # type: ignore[call-overload]
        model=DEMO_LLM_NAME, input="Weather?", tools=[tool], tool_choice="required",
        parallel_tool_calls=False, max_output_tokens=80, temperature=0.5,
    )  # fmt: skip
    calls = [item for item in called.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), function["parameters"])  # type: ignore[index]
    answered = client.responses.create(
        model=DEMO_LLM_NAME, max_output_tokens=5, temperature=0,
        input=[
            {"role": "user", "content": "Weather?"},
            {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "The river"},
        ],
    )  # fmt: skip
    assert answered.output_text
