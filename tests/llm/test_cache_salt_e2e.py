"""Prefix-cache isolation end to end: another tenant's prompt prefix cannot be detected through
``usage.prompt_tokens_details.cached_tokens``, whether tenants differ by API key (the default
salt header) or by the ``cache_salt`` field; within one salt the prefix is reused."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from ortserve.llm.demo import DEMO_LLM_NAME, write_demo_llm
from ortserve.testing import ServerProcess, run_server

pytestmark = pytest.mark.e2e

_SECRET = (
    "The keeper wrote the secret combination in the log: seven, four, nine, one, and the ships "
    "at sea answered the lighthouse every evening"
)


@pytest.fixture(scope="module")
def llm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("salt_models")
    write_demo_llm(root)
    log = tmp_path_factory.mktemp("salt_logs") / "server.log"
    with run_server(root, log, ["--intra-op-threads", "1"]) as server:
        yield server


def _cached(server: ServerProcess, prompt: str, key: str | None = None, **fields: object) -> int:
    body = {"model": DEMO_LLM_NAME, "prompt": prompt, "max_tokens": 2, "temperature": 0, **fields}
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    request = urllib.request.Request(
        f"{server.http_url}/v1/completions", json.dumps(body).encode(), headers, method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        usage = json.loads(reply.read())["usage"]
    return int(usage["prompt_tokens_details"]["cached_tokens"])


def test_another_api_keys_prefix_is_not_reported_as_cached(llm_server: ServerProcess) -> None:
    assert _cached(llm_server, _SECRET + " alpha", key="tenant-a") == 0
    assert _cached(llm_server, _SECRET + " beta", key="tenant-b") == 0
    assert _cached(llm_server, _SECRET + " beta") == 0
    assert _cached(llm_server, _SECRET + " gamma", key="tenant-a") >= 16


def test_another_cache_salts_prefix_is_not_reported_as_cached(llm_server: ServerProcess) -> None:
    prompt = _SECRET.replace("seven", "eight")
    assert _cached(llm_server, prompt + " alpha", key="shared", cache_salt="user-1") == 0
    assert _cached(llm_server, prompt + " beta", key="shared", cache_salt="user-2") == 0
    assert _cached(llm_server, prompt + " beta", key="shared") == 0
    assert _cached(llm_server, prompt + " gamma", key="shared", cache_salt="user-1") >= 16


def test_a_cache_salt_that_is_not_a_string_is_a_400_naming_it(llm_server: ServerProcess) -> None:
    with pytest.raises(urllib.error.HTTPError) as raised:
        _cached(llm_server, "The lighthouse", cache_salt=7)
    assert raised.value.code == 400
    assert json.loads(raised.value.read())["error"]["param"] == "cache_salt"
