"""The flow of docs/traffic.md end to end: quantize a version, load it as a shadow, watch its
divergence, then roll it out as a canary until it serves all traffic."""

from __future__ import annotations

import contextlib
import json
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from ortserve.quantization.convert import Method
from ortserve.quantization.quantizer import QuantizeJob, quantize
from ortserve.testing import ServerProcess, run_server
from waiting import wait_until

pytestmark = pytest.mark.e2e


def routing(server: ServerProcess, method: str = "GET", body: object = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{server.http_url}/v2/routing/models/small_mlp", data, method=method)
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())


def infer(client: httpclient.InferenceServerClient, user: str) -> str:
    tensor = httpclient.InferInput("input", [1, 64], "FP32")
    tensor.set_data_from_numpy(np.random.default_rng(len(user)).standard_normal((1, 64)).astype(np.float32))
    return str(
        client.infer("small_mlp", [tensor], headers={"X-User-ID": user}).get_response()["model_version"]
    )


def test_quantize_then_shadow_then_canary_then_rollout(demo_repository: Path, tmp_path: Path) -> None:
    root = tmp_path / "models"
    shutil.copytree(demo_repository / "small_mlp", root / "small_mlp")
    with (root / "small_mlp" / "config.yaml").open("a", encoding="utf-8") as config:
        config.write("\nversion_policy: all\n")
    [_, candidate] = quantize(QuantizeJob(root, "small_mlp", (Method.DYNAMIC_INT8,)))
    assert candidate.version == "2" and candidate.max_abs is not None
    with (
        run_server(root, tmp_path / "server.log", ["--intra-op-threads", "1"]) as server,
        contextlib.closing(httpclient.InferenceServerClient(server.http_address)) as client,
    ):
        # 1. shadow: every request also runs on the INT8 version; clients keep getting version 1
        routing(server, "PUT", {"split": {"1": 100}, "shadow": {"version": "2", "fraction": 1.0}})
        assert {infer(client, f"u{i}") for i in range(30)} == {"1"}
        wait_until(  # copies are gathered (up to 100 ms), then compared
            lambda: sum(routing(server)["shadow"]["compared"].values()) >= 30, 20, "30 comparisons"
        )
        [divergence] = routing(server)["shadow"]["divergence"]
        assert divergence["pairs"] == 30 and divergence["max_abs_diff"] < 0.5
        # 2. canary, rolled out while its divergence and error rate stay within the guards
        guards = {"max_divergence": 0.5, "compare_fraction": 1.0, "max_p99_ratio": None, "max_error_rate": 0}
        rollout = {"candidate": "2", "baseline": "1", "steps": [25, 100], "interval": 0.3, "min_requests": 10}
        routing(server, "PUT", {"rollout": {**rollout, "guards": guards}})
        deadline = time.monotonic() + 60
        state = routing(server)
        i = 0
        while state["rollout"]["state"] == "progressing" and time.monotonic() < deadline:
            infer(client, f"k{i}")
            i += 1
            if i % 10 == 0:
                state = routing(server)
        assert state["rollout"]["state"] == "completed", state
        assert state["roles"] == {"1": "deprecated", "2": "active"}
        assert {infer(client, f"z{i}") for i in range(10)} == {"2"}
