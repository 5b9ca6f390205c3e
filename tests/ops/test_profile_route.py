"""On-demand profiling: the restricted route answers the operators that took the time, keeps the
Chrome trace, feeds ortserve_ort_op_seconds_total, and refuses what it cannot profile; the GC
pause histogram is exposed by the same server."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from model_builders import write_scaled_version
from ortserve.server.profiling import operator_times
from ortserve.testing import ServerProcess, run_server

KEY = {"x-admin-key": "k"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("profile-models")
    write_scaled_version(root, "scaled", 1, 3.0)
    args = ["--http-restricted-api", "model-repository:x-admin-key=k", "--intra-op-threads", "1"]
    with run_server(root, tmp_path_factory.mktemp("profile-logs") / "server.log", args) as running:
        yield running


def profile(server: ServerProcess, path: str, body: object, headers: dict[str, str]) -> tuple[int, Any]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(f"{server.http_url}{path}", data, headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return int(reply.status), json.loads(reply.read())
    except urllib.error.HTTPError as error:
        answer = json.loads(error.read())
        error.close()
        return int(error.code), answer


def test_operator_times_add_up_kernel_events_by_op_type_largest_first() -> None:
    events = [
        {"cat": "Node", "name": "a_kernel_time", "dur": 30, "args": {"op_name": "MatMul"}},
        {"cat": "Node", "name": "b_kernel_time", "dur": 50, "args": {"op_name": "Add"}},
        {"cat": "Node", "name": "c_kernel_time", "dur": 40, "args": {"op_name": "MatMul"}},
        {"cat": "Node", "name": "a_fence_before", "dur": 99, "args": {"op_name": "MatMul"}},
        {"cat": "Session", "name": "model_run", "dur": 500},
    ]
    assert [(o.op_type, round(o.seconds * 1e6), o.calls) for o in operator_times(events)] == [
        ("MatMul", 70, 2),
        ("Add", 50, 1),
    ]


def test_a_profile_answers_top_operators_keeps_the_trace_and_feeds_the_metric(server: ServerProcess) -> None:
    status, answer = profile(server, "/v2/models/scaled/versions/1/profile", {"runs": 5, "batch": 4}, KEY)
    assert status == 200, answer
    assert answer["runs"] == 5 and answer["model"] == "scaled" and answer["version"] == "1"
    assert "Mul" in [op["op_type"] for op in answer["operators"]]
    assert sum(op["share"] for op in answer["operators"]) == pytest.approx(1.0, abs=0.01)
    trace = json.loads(Path(answer["trace_file"]).read_text(encoding="utf-8"))
    assert any(event.get("cat") == "Node" for event in trace)
    with urllib.request.urlopen(f"{server.http_url}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    assert 'ortserve_ort_op_seconds_total{model="scaled",op_type="Mul",version="1"}' in text
    assert 'ortserve_gc_pause_seconds_count{generation="0"}' in text


def test_profiles_are_restricted_bounded_and_only_for_onnx_graphs(server: ServerProcess) -> None:
    path = "/v2/models/scaled/profile"
    assert profile(server, path, {"runs": 1}, {})[0] == 403
    assert profile(server, path, {"runs": 0}, KEY)[0] == 400
    assert profile(server, path, {"seconds": 3600}, KEY)[0] == 400
    assert profile(server, path, ["runs"], KEY)[0] == 400
    assert profile(server, "/v2/models/nothing/profile", {}, KEY)[0] == 404
    status, answer = profile(server, path, {"seconds": 0.2}, KEY)
    assert status == 200 and answer["runs"] >= 1
