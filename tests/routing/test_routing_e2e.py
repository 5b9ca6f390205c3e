"""Routing end to end with tritonclient over HTTP and gRPC: sticky split, override header and
ab_tag, explicit versions, the restricted control endpoint, a policy replaced under load,
shadow metrics, roles in the index and metadata, and a diverging candidate rolled back."""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from model_builders import write_scaled_version
from ortserve.testing import ServerProcess, run_server
from waiting import wait_until

pytestmark = pytest.mark.e2e

KEY = {"X-Control-Key": "s3cret"}
X = np.ones((1, 4), dtype=np.float32)
CONFIG = """\
routing:
  split: {"1": 70, "2": 30}
  override: {variants: {fast: "2"}}
  shadow: {version: "3", fraction: 1.0}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("routing-models")
    for version, scale in ((1, 1.0), (2, 2.0), (3, 1.5)):
        write_scaled_version(root, "r", version, scale)
    (root / "r" / "config.yaml").write_text(CONFIG + "version_policy: all\n", encoding="utf-8")
    log = tmp_path_factory.mktemp("routing-logs") / "server.log"
    args = ["--http-restricted-api", "routing:X-Control-Key=s3cret", "--intra-op-threads", "1"]
    with run_server(root, log, args) as running:
        yield running


def http_version(server: ServerProcess, **options: Any) -> str:
    with contextlib.closing(httpclient.InferenceServerClient(server.http_address)) as client:
        tensor = httpclient.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(X)
        result = client.infer("r", [tensor], **options)
        version = result.get_response()["model_version"]
        assert float(result.as_numpy("y")[0, 0]) == {"1": 1.0, "2": 2.0, "3": 1.5}[version]
        return str(version)


def grpc_version(server: ServerProcess, **options: Any) -> str:
    with grpcclient.InferenceServerClient(server.grpc_address) as client:
        tensor = grpcclient.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(X)
        return str(client.infer("r", [tensor], **options).get_response().model_version)


def control(server: ServerProcess, method: str, body: object = None, key: bool = True) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{server.http_url}/v2/routing/models/r", data, headers=KEY if key else {}, method=method
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())


def test_a_key_sticks_to_one_version_on_both_transports_and_the_split_holds(server: ServerProcess) -> None:
    seen: dict[str, str] = {}
    for i in range(150):
        user = f"user-{i}"
        seen[user] = http_version(server, headers={"X-User-ID": user})
    for user in list(seen)[:20]:
        assert http_version(server, headers={"X-User-ID": user}) == seen[user]
        assert grpc_version(server, headers={"x-user-id": user}) == seen[user]
    share = Counter(seen.values())["2"] / len(seen)
    assert 0.15 <= share <= 0.45
    assert set(seen.values()) == {"1", "2"}  # the shadow version never answers


def test_override_header_and_ab_tag_force_a_version_but_an_explicit_version_wins(
    server: ServerProcess,
) -> None:
    assert http_version(server, headers={"X-Model-Version": "fast"}) == "2"
    assert http_version(server, parameters={"ab_tag": "1"}) == "1"
    assert grpc_version(server, parameters={"ab_tag": "fast"}) == "2"
    assert grpc_version(server, headers={"x-model-version": "3"}) == "3"
    assert http_version(server, model_version="1", parameters={"ab_tag": "fast"}) == "1"
    assert grpc_version(server, model_version="3", headers={"x-model-version": "fast"}) == "3"


def test_an_unknown_tag_is_a_client_error(server: ServerProcess) -> None:
    with pytest.raises(Exception, match="names no variant"):
        http_version(server, parameters={"ab_tag": "nope"})


def test_the_control_endpoint_is_restricted_and_shows_counts_roles_and_divergence(
    server: ServerProcess,
) -> None:
    with pytest.raises(urllib.error.HTTPError) as refused:
        control(server, "GET", key=False)
    assert refused.value.code == 403
    refused.value.close()
    for _ in range(5):
        http_version(server)
    # shadow copies are gathered (up to 100 ms), then compared
    wait_until(lambda: control(server, "GET")["shadow"]["compared"], 20, "a shadow comparison")
    state = control(server, "GET")
    assert state["source"] == "config.yaml"
    assert state["roles"] == {"1": "active", "2": "canary", "3": "shadow"}
    assert state["versions"]["1"]["requests"] > 0
    [divergence, *_] = [d for d in state["shadow"]["divergence"] if d["primary"] == "1"]
    assert (divergence["shadow"], divergence["output"], divergence["max_abs_diff"]) == ("3", "y", 0.5)
    with urllib.request.urlopen(f"{server.http_url}/metrics", timeout=10) as reply:
        metrics = reply.read().decode()
    assert (
        'ortserve_shadow_max_abs_diff_bucket{le="0.5",model="r",output="y",primary="1",shadow="3"}' in metrics
    )
    assert 'ortserve_version_role{model="r",role="shadow",version="3"} 1.0' in metrics
    with contextlib.closing(httpclient.InferenceServerClient(server.http_address)) as client:
        index = {
            row["version"]: row["reason"] for row in client.get_model_repository_index() if row["name"] == "r"
        }
        assert index == {"1": "active", "2": "canary (30%)", "3": "shadow"}
        assert client.get_model_metadata("r")["parameters"]["roles"]["3"] == "shadow"


def test_a_policy_replaced_under_load_drops_no_request(server: ServerProcess) -> None:
    failures: list[BaseException] = []
    versions: Counter[str] = Counter()
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                versions[http_version(server)] += 1
            except BaseException as exc:  # counted: the test fails on any
                failures.append(exc)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        for split in ({"2": 100}, {"1": 50, "2": 50}, {"1": 100}):
            control(server, "PUT", {"split": split, "shadow": None})
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not failures
    assert control(server, "GET")["source"] == "control"
    assert {http_version(server, headers={"X-User-ID": f"u{i}"}) for i in range(10)} == {"1"}
    with pytest.raises(urllib.error.HTTPError) as invalid:
        control(server, "PUT", {"split": {"9": 100}})
    assert invalid.value.code == 400
    invalid.value.close()


def test_a_diverging_candidate_is_rolled_back_and_marked_rejected(server: ServerProcess) -> None:
    guards = {"max_divergence": 0.01, "compare_fraction": 1.0, "max_p99_ratio": None}
    rollout = {"candidate": "2", "baseline": "1", "steps": [50, 100], "interval": 0.2, "min_requests": 20}
    control(server, "PUT", {"rollout": {**rollout, "guards": guards}})
    for i in range(60):
        http_version(server, headers={"X-User-ID": f"k{i}"})

    def ended() -> Any:  # the comparisons land once the gathered copies ran
        state = control(server, "GET")
        return state if state["rollout"]["state"] != "progressing" else None

    state = wait_until(ended, 20, "the rollout to end")
    assert state["rollout"]["state"] == "rejected"
    assert "max_divergence" in state["rollout"]["reason"]
    assert state["roles"]["2"] == "rejected"
    with contextlib.closing(httpclient.InferenceServerClient(server.http_address)) as client:
        [reason] = [
            r["reason"]
            for r in client.get_model_repository_index()
            if r["name"] == "r" and r["version"] == "2"
        ]
        assert reason.startswith("rejected: rolled back at 50%: max_divergence")
    assert {http_version(server, headers={"X-User-ID": f"z{i}"}) for i in range(10)} == {"1"}
    assert "rollout of version 2 rolled back" in Path(server.log_path).read_text()
    control(server, "DELETE")
    assert control(server, "GET")["policy"] is None
