"""A live server whose /metrics exposes every family the alerts and dashboards read.

One demo repository plus a model behind a fallback chain, a routed model with a rollout in
progress and a model that fails to load, after a little traffic of each kind (a success, a
refusal, an LLM completion), so that every family the deploy files use has samples to check.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from model_builders import write_scaled_version
from ortserve.demo import write_demo_repository
from ortserve.llm.demo import write_demo_llm
from ortserve.testing import ServerProcess, run_server
from promql_names import Catalogue

ROUTED = """\
version_policy: all
routing:
  rollout: {candidate: "2", baseline: "1", steps: [10, 100], interval: 3600, min_requests: 100000}
"""


def post(url: str, document: object) -> int:
    request = urllib.request.Request(url, json.dumps(document).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            reply.read()
            return int(reply.status)
    except urllib.error.HTTPError as error:
        error.close()
        return int(error.code)


def _rows(name: str, width: int, **parameters: object) -> dict[str, object]:
    body: dict[str, object] = {
        "inputs": [{"name": name, "datatype": "FP32", "shape": [1, width], "data": [0.5] * width}]
    }
    if parameters:
        body["parameters"] = parameters
    return body


def drive_traffic(server: ServerProcess) -> None:
    """One request of each kind the families need."""
    base = server.http_url
    assert post(f"{base}/v2/models/small_mlp/infer", _rows("input", 64)) == 200
    # 1 µs: refused at admission (504 when the deadline cannot be met, 429 before that rule)
    assert post(f"{base}/v2/models/small_mlp/infer", _rows("input", 64, timeout=1)) in (429, 504)
    for _ in range(4):
        assert post(f"{base}/v2/models/guarded/infer", _rows("x", 4)) == 200
        assert post(f"{base}/v2/models/routed/infer", _rows("x", 4)) == 200
    completion = {"model": "tiny_llm", "prompt": "hello there", "max_tokens": 4}
    assert post(f"{base}/v1/completions", completion) == 200
    assert post(f"{base}/v2/repository/models/hotword/unload", {}) == 200
    assert post(f"{base}/v2/models/small_mlp/profile", {"runs": 2}) == 200


@pytest.fixture(scope="session")
def ops_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("ops-models")
    write_demo_repository(root)
    write_demo_llm(root)
    write_scaled_version(root, "guarded", 1, 2.0)
    (root / "guarded" / "config.yaml").write_text("fallback: {}\n", encoding="utf-8")
    for version in (1, 2):
        write_scaled_version(root, "routed", version, float(version))
    (root / "routed" / "config.yaml").write_text(ROUTED, encoding="utf-8")
    broken = root / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.onnx").write_bytes(b"not an onnx file")
    log = tmp_path_factory.mktemp("ops-logs") / "server.log"
    args = ["--no-strict-readiness", "--intra-op-threads", "1", "--model-control-mode", "explicit"]
    args += ["--load-model", "*", "--tenant-quota", "requests=100000"]
    with run_server(root, log, args) as server:
        drive_traffic(server)
        yield server


def scrape(server: ServerProcess) -> str:
    with urllib.request.urlopen(f"{server.http_url}/metrics", timeout=30) as reply:
        return bytes(reply.read()).decode()


@pytest.fixture(scope="session")
def catalogue(ops_server: ServerProcess) -> Catalogue:
    """Every sample name the live server exposes, with its label names and values."""
    found = Catalogue()
    for family in text_string_to_metric_families(scrape(ops_server)):
        for sample in family.samples:
            found.add(sample.name, dict(sample.labels))
    return found
