"""Token streaming over gRPC (``ModelStreamInfer`` on an LLM) end to end, against a real server on
the demo LM: the real ``tritonclient.grpc`` streaming API and ``grpc.aio`` on the generated
stubs; a response per step flagged ``triton_final_response``, errors per message, the
sequence freed when the client leaves, and the request counted as HTTP generation is."""

from __future__ import annotations

import asyncio
import json
import queue
import shutil
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ortserve.llm.demo import DEMO_LLM_NAME, write_demo_llm
from ortserve.testing import ServerProcess, run_server
from workers_helpers import wait_until

pytestmark = pytest.mark.e2e

_ONE_SLOT = "kind: llm\nintra_op_threads: 1\nllm:\n  max_num_seqs: 1\n  max_waiting: 1\n"
_PROMPT = "The river runs"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("llm_models")
    write_demo_llm(root)
    shutil.copytree(root / DEMO_LLM_NAME / "1", root / "one_slot" / "1")
    (root / "one_slot" / "config.yaml").write_text(_ONE_SLOT)
    log = tmp_path_factory.mktemp("llm_logs") / "server.log"
    with run_server(root, log, ["--intra-op-threads", "1"]) as process:
        yield process


def _post(server: ServerProcess, path: str, body: dict[str, object]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{server.http_url}{path}", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        answer: dict[str, Any] = json.loads(reply.read())
        return answer


def _text(value: str, name: str = "text_input") -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [1], "BYTES")
    tensor.set_data_from_numpy(np.array([value.encode()], dtype=object))
    return tensor


def _flag(value: bool, name: str = "stream") -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [1], "BOOL")
    tensor.set_data_from_numpy(np.array([value]))
    return tensor


def _collect(answers: queue.Queue[tuple[Any, Any]], finals: int) -> list[tuple[Any, Any]]:
    """Every callback until ``finals`` responses flagged final (errors are final too)."""
    got: list[tuple[Any, Any]] = []
    while finals:
        result, error = answers.get(timeout=60)
        got.append((result, error))
        if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
            finals -= 1
    return got


def test_tritonclient_streams_a_response_per_step_ending_flagged_final(server: ServerProcess) -> None:
    whole = _post(
        server,
        f"/v2/models/{DEMO_LLM_NAME}/generate",
        {"text_input": _PROMPT, "parameters": {"max_tokens": 24, "temperature": 0}},
    )
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_address)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for request_id in ("a", "b"):
            client.async_stream_infer(
                DEMO_LLM_NAME,
                [_text(_PROMPT), _flag(True)],
                request_id=request_id,
                parameters={"max_tokens": 24, "temperature": 0},
            )
        got = _collect(answers, 2)
    finally:
        client.stop_stream()
        client.close()
    assert all(error is None for _, error in got)
    by_id: dict[str, list[Any]] = {"a": [], "b": []}
    for result, _ in got:
        by_id[result.get_response().id].append(result)
    for pieces in by_id.values():
        assert len(pieces) > 5  # one response per step, not one answer
        finals = [p.get_response().parameters["triton_final_response"].bool_param for p in pieces]
        assert finals == [False] * (len(pieces) - 1) + [True]
        text = "".join(p.as_numpy("text_output")[0].decode() for p in pieces)
        assert text == whole["text_output"]
        last = pieces[-1].get_response().parameters
        assert last["finish_reason"].string_param == whole["finish_reason"]
        assert last["completion_tokens"].int64_param == whole["usage"]["completion_tokens"]


def test_stream_false_answers_once_and_errors_come_per_message(server: ServerProcess) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_address)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer(
            DEMO_LLM_NAME, [_text(_PROMPT), _flag(False)], request_id="whole", parameters={"max_tokens": 8}
        )
        client.async_stream_infer(
            DEMO_LLM_NAME, [_text(_PROMPT)], request_id="bad", parameters={"frobnicate": 1}
        )
        sampling = _text(
            json.dumps({"max_tokens": 3, "temperature": 0, "stop": ["zzz"]}), "sampling_parameters"
        )
        client.async_stream_infer(DEMO_LLM_NAME, [_text(_PROMPT), sampling], request_id="json")
        got = _collect(answers, 3)
    finally:
        client.stop_stream()
        client.close()
    errors = [str(error) for _, error in got if error is not None]
    assert len(errors) == 1 and "frobnicate" in errors[0]
    results = [result for result, error in got if error is None]
    whole = [r for r in results if r.get_response().id == "whole"]
    assert len(whole) == 1 and whole[0].get_response().parameters["completion_tokens"].int64_param == 8
    tokens = [r for r in results if r.get_response().id == "json"]
    assert tokens[-1].get_response().parameters["completion_tokens"].int64_param == 3


def _metric(server: ServerProcess, name: str, labels: str) -> float:
    with urllib.request.urlopen(f"{server.http_url}/metrics") as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(name + "{") and all(part in line for part in labels.split(",")):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _request(prompt: str, request_id: str, **parameters: Any) -> service_pb2.ModelInferRequest:
    message = service_pb2.ModelInferRequest(model_name="one_slot", id=request_id)
    tensor = message.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(prompt.encode())
    for key, value in parameters.items():
        if isinstance(value, bool):
            message.parameters[key].bool_param = value
        else:
            message.parameters[key].int64_param = value
    return message


async def _leave_mid_stream(address: str) -> int:
    """grpc.aio: read three steps of a long generation, then cancel the call."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        call = stub.ModelStreamInfer()
        await call.write(_request("The", "long", max_tokens=2000, ignore_eos=True))
        seen = 0
        async for response in call:
            assert not response.error_message
            seen += 1
            if seen == 3:
                break
        call.cancel()
        return seen


async def _one_whole(address: str) -> list[service_pb2.ModelStreamInferResponse]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        call = stub.ModelStreamInfer()
        await call.write(_request("The river", "next", max_tokens=5, temperature=0))
        await call.done_writing()
        return [response async for response in call]


def test_a_client_that_leaves_frees_the_sequence_and_is_counted(server: ServerProcess) -> None:
    labels = 'model="one_slot",transport="grpc",outcome="success"'
    before = _metric(server, "ortserve_llm_generation_tokens_total", 'model="one_slot"')
    requests_before = _metric(server, "ortserve_requests_total", labels)
    assert asyncio.run(_leave_mid_stream(server.grpc_address)) == 3
    wait_until(lambda: _metric(server, "ortserve_llm_running_sequences", 'model="one_slot"') == 0, 20.0)
    assert _metric(server, "ortserve_llm_generation_tokens_total", 'model="one_slot"') - before < 2000
    # The one place is free for the next request, which streams to its end.
    answers = asyncio.run(_one_whole(server.grpc_address))
    assert [a.infer_response.parameters["triton_final_response"].bool_param for a in answers][-1]
    assert answers[-1].infer_response.parameters["completion_tokens"].int64_param == 5
    wait_until(lambda: _metric(server, "ortserve_requests_total", labels) >= requests_before + 2, 20.0)
