"""A generation request's ``priority`` reaches the engine's queue from both HTTP faces: the
OpenAI body field (vLLM's name) and the generate route's ``parameters``, read as classic models
read theirs (0 the default lane, 1 the most urgent, larger later); a bad one is a 400 naming it.
The queue's order by lane is tested on a fake clock (test_engine_scheduling.py)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from ortserve.llm.demo import DEMO_LLM_NAME, write_demo_llm
from ortserve.testing import ServerProcess, run_server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def llm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("priority_models")
    write_demo_llm(root)
    log = tmp_path_factory.mktemp("priority_logs") / "server.log"
    with run_server(root, log, ["--intra-op-threads", "1"]) as server:
        yield server


def _post(server: ServerProcess, path: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        f"{server.http_url}{path}", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        answer: dict[str, object] = json.loads(reply.read())
    return answer


def _completion(priority: object) -> dict[str, object]:
    return {"model": DEMO_LLM_NAME, "prompt": "The lighthouse", "max_tokens": 2, "priority": priority}


def _generate(priority: object) -> dict[str, object]:
    return {"text_input": "The lighthouse", "parameters": {"max_tokens": 2, "priority": priority}}


def test_a_priority_lane_is_accepted_on_both_faces(llm_server: ServerProcess) -> None:
    assert _post(llm_server, "/v1/completions", _completion(2))["choices"]
    assert _post(llm_server, f"/v2/models/{DEMO_LLM_NAME}/generate", _generate(2))["text_output"] is not None


@pytest.mark.parametrize("face", ["openai", "generate"])
def test_a_bad_priority_is_a_400_naming_it(llm_server: ServerProcess, face: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as raised:
        if face == "openai":
            _post(llm_server, "/v1/completions", _completion(-1))
        else:
            _post(llm_server, f"/v2/models/{DEMO_LLM_NAME}/generate", _generate("high"))
    assert raised.value.code == 400
    assert "priority" in raised.value.read().decode()
