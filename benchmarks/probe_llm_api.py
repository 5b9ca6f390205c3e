"""Issue 29's probe table, re-run against a real server on the demo LM: each row sends the
feature's request and checks its effect on the answer (not only the status), and prints a
Markdown table row: "yes", or the 400's message when the server refuses it by name.

    .venv/bin/python benchmarks/probe_llm_api.py
"""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ortserve.llm.demo import DEMO_LLM_NAME, write_demo_llm
from ortserve.testing import ServerProcess, run_server

_PROMPT = "The lighthouse stood at the end of the long stone pier, and every evening the keeper"
_CHAT = {"model": DEMO_LLM_NAME, "messages": [{"role": "user", "content": _PROMPT}], "max_tokens": 8}
_COMPLETION = {"model": DEMO_LLM_NAME, "prompt": _PROMPT, "max_tokens": 8}
Answer = dict[str, object]


def _call(server: ServerProcess, method: str, path: str, body: Answer | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{server.http_url}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _json(server: ServerProcess, path: str, body: Answer) -> Answer:
    status, raw = _call(server, "POST", path, body)
    answer = json.loads(raw)
    if status != 200:
        raise AssertionError(f"{status}: {answer}")
    return dict(answer)


def _choices(answer: Answer) -> list[dict[str, object]]:
    return list(answer["choices"])  # type: ignore[call-overload]


def _health(server: ServerProcess) -> str:
    status, body = _call(server, "GET", "/health")
    return f"{status}, empty body" if status == 200 and body == b"" else f"no ({status})"


def _tokenize(server: ServerProcess) -> str:
    tokens = _json(server, "/tokenize", {"model": DEMO_LLM_NAME, "prompt": _PROMPT})["tokens"]
    back = _json(server, "/detokenize", {"model": DEMO_LLM_NAME, "tokens": tokens})["prompt"]
    return "200 (round trip exact)" if back == _PROMPT else "no"


def _embeddings(server: ServerProcess) -> str:
    status, raw = _call(server, "POST", "/v1/embeddings", {"model": DEMO_LLM_NAME, "input": "x"})
    message = json.loads(raw)["error"]["message"]
    # the demo LM is no encoder: the route's effect on encoders is in tests/server/test_embeddings_e2e.py
    return f'yes, for ONNX encoders with tokenizer.json; the demo LM: {status} "{message}"'


def _logprobs(server: ServerProcess) -> str:
    chat = _choices(_json(server, "/v1/chat/completions", {**_CHAT, "logprobs": True, "top_logprobs": 3}))[0]
    content = chat["logprobs"]["content"]  # type: ignore[index]
    legacy = _choices(_json(server, "/v1/completions", {**_COMPLETION, "logprobs": 3}))[0]["logprobs"]
    ok = len(content) == 8 and all(len(t["top_logprobs"]) == 3 for t in content)  # type: ignore[index]
    return "yes (chat 3 alternatives per token, legacy 3)" if ok and legacy["top_logprobs"] else "no"  # type: ignore[index]


def _n(server: ServerProcess) -> str:
    answer = _json(server, "/v1/completions", {**_COMPLETION, "n": 2, "temperature": 0})
    texts = {c["text"] for c in _choices(answer)}
    return (
        "yes (2 choices, equal at temperature 0)" if len(_choices(answer)) == 2 and len(texts) == 1 else "no"
    )


def _logit_bias(server: ServerProcess) -> str:
    tokens = _json(
        server, "/tokenize", {"model": DEMO_LLM_NAME, "prompt": " lighthouse", "add_special_tokens": False}
    )
    token = tokens["tokens"][-1]  # type: ignore[index]
    answer = _json(
        server, "/v1/completions", {**_COMPLETION, "logit_bias": {str(token): 100}, "temperature": 1.0}
    )
    text = str(_choices(answer)[0]["text"])
    return "yes (+100 on ' lighthouse': 8 of them)" if text.count("lighthouse") == 8 else f"no ({text!r})"


def _penalties(server: ServerProcess) -> str:
    """Each field changes a seeded sample's text (same seed, same prompt, without the field)."""
    ask = {**_COMPLETION, "max_tokens": 24, "temperature": 1.0, "seed": 5}
    plain = _choices(_json(server, "/v1/completions", ask))[0]
    changed = []
    for field, value in (("repetition_penalty", 2.0), ("presence_penalty", 2.0), ("frequency_penalty", 2.0),
                         ("min_p", 0.5)):  # fmt: skip
        other = _choices(_json(server, "/v1/completions", {**ask, field: value}))[0]
        changed.append(field if other["text"] != plain["text"] else f"{field}: no effect")
    return "yes (each changes a seeded sample: " + ", ".join(changed) + ")"


def _json_schema(server: ServerProcess) -> str:
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "n": {"type": "integer"}},
              "required": ["name", "n"], "additionalProperties": False}  # fmt: skip
    answer = _json(server, "/v1/chat/completions", {**_CHAT, "max_tokens": 60, "temperature": 1.0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})  # fmt: skip
    value = json.loads(str(_choices(answer)[0]["message"]["content"]))  # type: ignore[index]
    return "yes (answer parses and validates)" if set(value) == {"name", "n"} else "no"


def _json_object(server: ServerProcess) -> str:
    answer = _json(server, "/v1/chat/completions", {**_CHAT, "max_tokens": 40, "temperature": 1.0, "seed": 2,
                                                     "response_format": {"type": "json_object"}})  # fmt: skip
    choice = _choices(answer)[0]
    if choice["finish_reason"] == "length":
        return "yes (cut by max_tokens: finish_reason length)"
    value = json.loads(str(choice["message"]["content"]))  # type: ignore[index]
    return "yes (answer parses as an object)" if isinstance(value, dict) else "no"


def _template(server: ServerProcess) -> str:
    """The ``templated`` copy of the demo LM renders ``tools`` and a ``chat_template_kwargs``
    variable: the rendered prompt (``/tokenize`` + ``/detokenize``) shows both."""
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    body: Answer = {"model": _TEMPLATED, "messages": [{"role": "user", "content": "hi"}], "tools": [tool],
            "chat_template_kwargs": {"mood": "sunny"}}  # fmt: skip
    tokens = _json(server, "/tokenize", body)["tokens"]
    text = str(_json(server, "/detokenize", {"model": _TEMPLATED, "tokens": tokens})["prompt"])
    squeezed = text.replace(" ", "")  # the demo's tiny tokenizer detokenizes with spaces between pieces
    ok = "tools:get_weather" in squeezed and "moodsunny" in squeezed
    return "yes (`tools` and `chat_template_kwargs` reach the Jinja2 template)" if ok else f"no ({text!r})"


def _grpc_stream(server: ServerProcess) -> str:
    request = service_pb2.ModelInferRequest(model_name=DEMO_LLM_NAME, id="probe")
    tensor = request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(_PROMPT.encode())
    request.parameters["max_tokens"].int64_param = 8
    with grpc.insecure_channel(f"{server.host}:{server.grpc_port}") as channel:
        answers = list(
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter([request]), timeout=60)
        )
    finals = [a.infer_response.parameters["triton_final_response"].bool_param for a in answers]
    if any(a.error_message for a in answers) or finals[-1:] != [True] or len(answers) < 2:
        return f"no ({len(answers)} responses, final flags {finals})"
    return (
        f"yes (`ModelStreamInfer`: {len(answers)} responses for 8 tokens, the last `triton_final_response`)"
    )


def _tools(server: ServerProcess) -> str:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string", "maxLength": 6}}, "required": ["city"],
            "additionalProperties": False}}}  # fmt: skip
    answer = _json(server, "/v1/chat/completions", {**_CHAT, "max_tokens": 60, "tools": [tool],
                                                     "tool_choice": "required", "parallel_tool_calls": False})  # fmt: skip
    choice = _choices(answer)[0]
    call = choice["message"]["tool_calls"][0]  # type: ignore[index]
    ok = choice["finish_reason"] == "tool_calls" and "city" in json.loads(call["function"]["arguments"])
    return "yes (required call parses into its arguments)" if ok else "no"


def _responses(server: ServerProcess) -> str:
    answer = _json(
        server, "/v1/responses", {"model": DEMO_LLM_NAME, "input": _PROMPT, "max_output_tokens": 8}
    )
    output = answer["output"][0]["content"][0]["text"]  # type: ignore[index]
    return "yes (text, streamed too; not stored: refused by name)" if output else "no"


def _unknown(server: ServerProcess) -> str:
    status, raw = _call(server, "POST", "/v1/chat/completions", {**_CHAT, "frobnicate": 1})
    error = json.loads(raw)["error"]
    return f'{status}, param "{error["param"]}"'


_PROBES: list[tuple[str, Callable[[ServerProcess], str]]] = [
    ("`GET /health`", _health),
    ("`POST /tokenize`, `/detokenize`", _tokenize),
    ("`POST /v1/embeddings`", _embeddings),
    ("completions `logprobs`, chat `logprobs` + `top_logprobs`", _logprobs),
    ("`n=2`", _n),
    ("`logit_bias`", _logit_bias),
    ("`min_p`, `repetition_penalty`, `presence_penalty`, `frequency_penalty`", _penalties),
    ("`response_format` `json_object`", _json_object),
    ("`response_format` `json_schema`", _json_schema),
    ("`tools` + `tool_choice`", _tools),
    ("`POST /v1/responses`", _responses),
    ("chat template: `tools`, `chat_template_kwargs` passed in", _template),
    ("token streaming over gRPC", _grpc_stream),
    ("an unknown field", _unknown),
]


_TEMPLATED = "templated"


def _write_templated(models: Path) -> None:
    """A copy of the demo LM whose chat template renders the tools and a ``mood`` variable."""
    shutil.copytree(models / DEMO_LLM_NAME, models / _TEMPLATED)
    config_path = models / _TEMPLATED / "1" / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = (
        "{% if tools %}tools: {% for t in tools %}{{ t['function']['name'] }} {% endfor %}{% endif %}"
        "{% if mood %}mood {{ mood }} {% endif %}" + config["chat_template"]
    )
    config_path.write_text(json.dumps(config))


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_demo_llm(root / "models")
        _write_templated(root / "models")
        with run_server(root / "models", root / "server.log", ["--intra-op-threads", "1"]) as server:
            print("| feature | ortserve |\n|---|---|")
            for name, probe in _PROBES:
                try:
                    cell = probe(server)
                except Exception as exc:  # a probe that fails is a finding, not a crash
                    cell = f"no ({type(exc).__name__}: {exc})"
                print(f"| {name} | {cell} |")


if __name__ == "__main__":
    main()
