"""LLM versions are routed by the same router as ONNX models, through the Exchange: a 70/30
sticky split (each key stays on its version), an override header, and a shadow version whose
agreement with the primary is reported by the routing GET."""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
import pytest_asyncio

from ortserve.core.dataplane import DataPlane
from ortserve.core.types import ServerMetadata
from ortserve.llm.demo import DEMO_LLM_NAME, write_demo_llm
from ortserve.metrics import ServerMetrics
from ortserve.protocol.tensors import TensorLimits
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.registry import ModelRegistry
from ortserve.routing.table import RoutingTable
from ortserve.server.exchange import Exchange
from ortserve.server.http.app import HttpApp
from ortserve.server.http.messages import HttpRequest, resolve_response
from ortserve.server.http.openai_routes import add_openai_routes
from ortserve.settings import ServerSettings
from ortserve.statistics import ServerStatistics
from ortserve.telemetry import Telemetry
from waiting import until

pytestmark = pytest.mark.asyncio(loop_scope="module")

KEYS = 2_000


@dataclass
class Routed:
    app: HttpApp
    exchange: Exchange
    table: RoutingTable
    metrics: ServerMetrics

    def version_for(self, headers: dict[str, str]) -> str:
        """The version the Exchange routes a request with these headers to (nothing generated)."""
        scope = self.exchange.begin("http", DEMO_LLM_NAME, None, None, None)
        llm = self.exchange.llm(scope, DEMO_LLM_NAME, None, headers.get)
        self.exchange.abandon(scope)
        return llm.info.version

    async def chat(self, headers: dict[bytes, bytes] | None = None) -> int:
        body = {
            "model": DEMO_LLM_NAME,
            "messages": [
                {"role": "user", "content": "The lighthouse stood at the end of the long stone pier"}
            ],
            "max_tokens": 6,
            "temperature": 0,
        }
        request = HttpRequest("POST", "/v1/chat/completions", "", headers or {}, orjson.dumps(body))
        return (await resolve_response(self.app(request))).status

    def served_by(self, version: str) -> float:
        labels = (f'model="{DEMO_LLM_NAME}"', f'version="{version}"', 'transport="http"', 'outcome="success"')
        for line in self.metrics.exposition().decode().splitlines():
            if line.startswith("ortserve_requests_total{") and all(label in line for label in labels):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def routed(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Routed]:
    models = tmp_path_factory.mktemp("llm_routing")
    write_demo_llm(models)
    shutil.copytree(models / DEMO_LLM_NAME / "1", models / DEMO_LLM_NAME / "2")
    with (models / DEMO_LLM_NAME / "config.yaml").open("a", encoding="utf-8") as config:
        config.write("version_policy: all\nintra_op_threads: 1\n")
    metrics = ServerMetrics(lambda: [], lambda: {})
    telemetry = Telemetry(ServerStatistics(), metrics)
    registry = ModelRegistry(observers=telemetry.observer_for)
    await LifecycleManager(registry, ServerSettings(model_repository=models, intra_op_threads=1)).start()
    dataplane = DataPlane(registry, ServerMetadata("ortserve", "test", ()))
    table = RoutingTable(registry, time.monotonic)
    dataplane.routers = table.routers
    exchange = Exchange(dataplane, telemetry, None, table.routers)
    app = HttpApp(dataplane, TensorLimits(), exchange=exchange)
    add_openai_routes(app, registry)
    try:
        yield Routed(app, exchange, table, metrics)
    finally:
        await registry.unload_all(5.0)


async def test_a_sticky_70_30_split_keeps_every_key_on_its_version(routed: Routed) -> None:
    routed.table.put(DEMO_LLM_NAME, {"split": {"1": 70, "2": 30}})
    first = {key: routed.version_for({"x-user-id": f"user-{key}"}) for key in range(KEYS)}
    again = {key: routed.version_for({"x-user-id": f"user-{key}"}) for key in range(KEYS)}
    assert again == first
    shares = Counter(first.values())
    assert 0.66 < shares["1"] / KEYS < 0.74 and shares["1"] + shares["2"] == KEYS

    # A real generation follows the same decision, and is counted under its version.
    key = next(k for k, v in first.items() if v == "2")
    before = routed.served_by("2")
    assert await routed.chat({b"x-user-id": f"user-{key}".encode()}) == 200
    assert routed.served_by("2") == before + 1


async def test_an_override_header_picks_the_version(routed: Routed) -> None:
    routed.table.put(DEMO_LLM_NAME, {"split": {"1": 100}})
    before = routed.served_by("2"), routed.served_by("1")
    assert await routed.chat({b"x-model-version": b"2"}) == 200
    assert await routed.chat() == 200
    assert (routed.served_by("2"), routed.served_by("1")) == (before[0] + 1, before[1] + 1)


async def test_a_shadow_version_reports_its_agreement(routed: Routed) -> None:
    routed.table.put(DEMO_LLM_NAME, {"split": {"1": 100}, "shadow": {"version": "2", "fraction": 1.0}})
    for _ in range(3):
        assert await routed.chat() == 200
    shadow = await _compared(routed, 3)
    [text] = [d for d in shadow["divergence"] if d["output"] == "text"]
    # The same weights, greedy: the copy agrees token for token.
    assert (text["primary"], text["shadow"], text["pairs"]) == ("1", "2", 3)
    assert text["top1_agreement"] == 1.0 and text["topk_agreement"] == 1.0
    assert shadow["sent"] == {"2": 3}


async def _compared(routed: Routed, count: int) -> dict[str, Any]:
    def shadow() -> dict[str, Any] | None:  # the copies finish after the primaries answered
        state = routed.table.get(DEMO_LLM_NAME)["shadow"]
        return dict(state) if sum(state["compared"].values()) >= count else None

    return await until(shadow, 30, "the shadow copies compared")


async def test_a_rollout_advances_on_llm_outcomes_and_a_breached_guard_rolls_it_back(routed: Routed) -> None:
    plan = {"candidate": "2", "baseline": "1", "steps": [50, 100], "interval": 0.05, "min_requests": 3}
    routed.table.put(DEMO_LLM_NAME, {"rollout": plan | {"guards": {"max_p99_ratio": 1000}}})
    state = await _rollout_until(routed, {"completed"})
    assert state["share_percent"] == 100 and state["events"].get("advanced") == 1

    # The other way round, with a latency guard no candidate can meet: back to the baseline.
    back = plan | {"candidate": "1", "baseline": "2", "guards": {"max_p99_ratio": 1e-6}}
    routed.table.put(DEMO_LLM_NAME, {"rollout": back})
    state = await _rollout_until(routed, {"rejected"})
    assert state["share_percent"] == 0 and "max_p99_ratio" in state["reason"]
    assert {routed.version_for({"x-user-id": f"user-{key}"}) for key in range(50)} == {"2"}


async def _rollout_until(routed: Routed, phases: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    key = 0
    while time.monotonic() < deadline:  # each answered request is an outcome the rollout reads
        key += 1
        assert await routed.chat({b"x-user-id": f"user-{key}".encode()}) == 200
        state = routed.table.get(DEMO_LLM_NAME)["rollout"]
        if state["state"] in phases:
            return dict(state)
    raise AssertionError(f"the rollout did not reach {phases}")
