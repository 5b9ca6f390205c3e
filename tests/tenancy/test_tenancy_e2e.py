"""API keys and quotas on a real server, over HTTP and gRPC: no key 401 / UNAUTHENTICATED, a
tenant past its quota 429 + Retry-After while another tenant is still served, per-tenant
metrics, and health and metadata open without a key."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from model_builders import write_scaled_version
from ortserve.testing import ServerProcess, run_server

pytestmark = pytest.mark.e2e

ROW = json.dumps(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
).encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("tenant-models")
    write_scaled_version(root, "m", 1, 2.0)
    keys = tmp_path_factory.mktemp("tenant-keys") / "keys"
    keys.write_text("acme key-acme\nglobex key-globex\n", encoding="utf-8")
    args = ["--api-key-file", str(keys), "--tenant-quota", "requests=3,burst=3", "--intra-op-threads", "1"]
    with run_server(root, tmp_path_factory.mktemp("tenant-logs") / "server.log", args) as running:
        yield running


def infer(server: ServerProcess, key: str | None) -> tuple[int, dict[str, str]]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(f"{server.http_url}/v2/models/m/infer", ROW, headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return int(reply.status), {k.lower(): v for k, v in reply.headers.items()}
    except urllib.error.HTTPError as error:
        found = {k.lower(): v for k, v in error.headers.items()}
        error.close()
        return int(error.code), found


def test_http_needs_a_key_and_a_tenant_over_quota_waits_while_another_is_served(
    server: ServerProcess,
) -> None:
    assert infer(server, None)[0] == 401
    assert infer(server, "key-wrong")[0] == 401
    statuses = [infer(server, "key-acme") for _ in range(6)]
    assert statuses[0][0] == 200
    refused = [headers for status, headers in statuses if status == 429]
    assert refused and int(refused[0]["retry-after"]) >= 1
    assert infer(server, "key-globex")[0] == 200
    with urllib.request.urlopen(f"{server.http_url}/v2/health/ready", timeout=10) as reply:
        assert reply.status == 200
    with urllib.request.urlopen(f"{server.http_url}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    assert 'ortserve_tenant_requests_total{outcome="refused",tenant="acme"}' in text
    assert 'ortserve_tenant_requests_total{outcome="admitted",tenant="globex"}' in text


def test_grpc_reads_the_key_from_metadata(server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(server.grpc_address) as client:
        tensor = grpcclient.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        with pytest.raises(InferenceServerException) as refused:
            client.infer("m", [tensor])
        assert "UNAUTHENTICATED" in str(refused.value.status())
        answer = client.infer("m", [tensor], headers={"authorization": "Bearer key-globex"})
        assert answer.as_numpy("y").tolist() == [[2.0, 2.0, 2.0, 2.0]]
